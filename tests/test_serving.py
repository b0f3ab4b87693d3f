"""Serving (rakv.serving): traces validated whole with one-line errors; the scheduler's budget order and K/V
budget without a model; every greedy output identical to the request served alone, whatever the arrivals, token
budget, batch cap, K/V budget (preemption), strategy and proposer; bad requests refused alone; complete lines
after a kill -9."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rakv.runtime.actions import Action
from rakv.runtime.cache import Hit, PrefixKVStore
from rakv.runtime.decoding import DecodeState, Sampling
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.proposers import PROPOSERS, PromptLookupProposer
from rakv.runtime.run_layout import ServedRunLayout
from rakv.runtime.strategies import Choice, action_of
from rakv.serving.acceptance import Acceptance
from rakv.serving.executor import RequestOutput, StepOutput
from rakv.serving.metrics import parse_goodput, read_run_summary
from rakv.serving.records import read_iterations
from rakv.serving.request import ServedRequest, Status
from rakv.serving.scheduler import Scheduler
from rakv.serving.server import ServeOptions, ServeParts, serve
from rakv.serving.trace import TraceRequest, generate_trace, read_trace, write_trace

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [(f"t{i}", " ".join(f"word{(i * 7 + j) % 50} and" for j in range(30 + i % 9))) for i in range(40)]


# --- traces ---

def write_lines(tmp_path, lines) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = '{"id": "a", "arrival_s": 0, "prompt": "hello there", "max_new_tokens": 4}'


@pytest.mark.parametrize("line, message", [
    ("{not json", r"trace.jsonl:2: not valid JSON"),
    ('{"arrival_s": 0, "prompt": "x", "max_new_tokens": 4}', r':2: field "id" must be a non-empty string'),
    ('{"id": "b", "arrival_s": -1, "prompt": "x", "max_new_tokens": 4}',
     r':2: field "arrival_s" must be a number >= 0'),
    ('{"id": "b", "prompt": "x", "max_new_tokens": 4}', r':2: missing field "arrival_s"'),
    ('{"id": "b", "arrival_s": 0, "prompt": 3, "max_new_tokens": 4}', r':2: field "prompt" must be a string'),
    ('{"id": "b", "arrival_s": 0, "prompt": "x", "max_new_tokens": 0}',
     r':2: field "max_new_tokens" must be an integer > 0'),
    ('{"id": "b", "arrival_s": 0, "prompt": "x", "max_new_tokens": 4, "salt": 1}',
     r':2: field "salt" must be a string'),
    ('{"id": "b", "arrival_s": 0, "prompt": "x", "max_new_tokens": 4, "turn": 1}',
     r':2: field "turn" needs a "conversation"'),
    ('{"id": "a", "arrival_s": 0, "prompt": "x", "max_new_tokens": 4}', r":2: field \"id\": 'a' appears twice"),
    ('{"id": "b", "prompt": "x", "max_new_tokens": 4, "conversation": "c", "turn": 1, "after_s": 1}',
     r':2: field "turn": conversation \'c\' expects turn 0 here, got 1'),
    ('[1, 2]', r":2: expected a JSON object"),
])
def test_a_malformed_line_is_refused_naming_the_line_and_the_field(tmp_path, line, message):
    with pytest.raises(RakvError, match=message):
        read_trace(write_lines(tmp_path, [GOOD, line]))


def test_a_later_turn_needs_its_think_time(tmp_path):
    lines = ['{"id": "c0", "arrival_s": 0, "prompt": "x", "max_new_tokens": 4, "conversation": "c", "turn": 0}',
             '{"id": "c1", "prompt": "x", "max_new_tokens": 4, "conversation": "c", "turn": 1}']
    with pytest.raises(RakvError, match=r':2: missing field "after_s"'):
        read_trace(write_lines(tmp_path, lines))


@pytest.mark.parametrize("kind", ["plain", "shared-prefix", "multi-turn", "interference", "structured"])
def test_generated_traces_are_seeded_and_read_back_as_written(tmp_path, kind):
    a = generate_trace(TEXTS, requests=12, rate=4.0, kind=kind, seed=3, groups=3, turns=3, system_words=40)
    b = generate_trace(TEXTS, requests=12, rate=4.0, kind=kind, seed=3, groups=3, turns=3, system_words=40)
    c = generate_trace(TEXTS, requests=12, rate=4.0, kind=kind, seed=4, groups=3, turns=3, system_words=40)
    assert a == b and a != c
    write_trace(tmp_path / "t.jsonl", a, {"seed": 3})
    assert read_trace(tmp_path / "t.jsonl") == a
    assert json.loads((tmp_path / "t.jsonl.meta.json").read_text()) == {"seed": 3}
    if kind == "shared-prefix":
        heads = {r.prompt.split("Question: ")[0] for r in a}
        assert len(heads) == 3 and all(len(h.split()) > 40 for h in heads)
    if kind == "multi-turn":
        assert [r.turn for r in a[:3]] == [0, 1, 2] and a[1].follows and a[1].after_s >= 0
    if kind == "interference":
        long = [r for r in generate_trace(TEXTS, requests=24, rate=4.0, kind=kind, long_every=8, long_words=300)
                if r.id.startswith("long")]
        assert [r.id for r in long] == ["long7", "long15", "long23"] and all(len(r.prompt.split()) == 300 for r in long)
    if kind == "structured":
        assert all('"title", "topic"' in r.prompt and r.prompt.endswith('JSON: {"title": "') for r in a)


@pytest.mark.parametrize("arrivals, burstiness", [("poisson", 1.0), ("gamma", 0.25)])
def test_arrivals_keep_the_rate_and_gamma_is_burstier(arrivals, burstiness):
    trace = generate_trace(TEXTS, requests=4000, rate=5.0, arrivals=arrivals, burstiness=burstiness, seed=0)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(trace, trace[1:])]
    mean = sum(gaps) / len(gaps)
    cv = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean
    assert mean == pytest.approx(0.2, rel=0.08)
    assert cv == pytest.approx(burstiness ** -0.5, rel=0.1)  # gamma of shape s: coefficient of variation 1/sqrt(s)


def test_goodput_slos_are_parsed_and_bad_ones_refused():
    assert parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    for bad in (["latency:3"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(RakvError):
            parse_goodput(bad)


# --- the scheduler through the step contract, with a fake K/V side and a fake executor ---

class FakeKV:
    """The K/V side the scheduler sees: bytes per position, a store offering `hits` (id -> positions), frees and
    commits recorded."""

    def __init__(self, bpt=10, hits=None, draft_bpt=0):
        self.bpt, self.draft_bpt, self.hits, self.freed, self.committed = bpt, draft_bpt, hits or {}, [], []
        self.published = []

    def bytes_per_token(self, request):
        return self.bpt + (self.draft_bpt if request.max_k else 0)

    def hit(self, request):
        return Hit(prompt_length=len(request.prompt), prefix_length=self.hits.get(request.id, 0) + 1)

    def free(self, request):
        self.freed.append(request.id)

    def commit(self, request, acceptance):
        self.committed.append(request.id)

    def publish(self, request):
        self.published.append(request.id)


class FakeAdmission:
    """Admission with a fixed action per request id (default: no reuse, no speculation); counts its decisions."""

    def __init__(self, actions=None):
        self.actions, self.acceptance, self.decided = actions or {}, Acceptance(), []

    def decide(self, request, hit, company=(), load=0.0):
        action = self.actions.get(request.id, Action(False, 0))
        self.decided.append((request.id, hit.reused_tokens))
        request.assign(Choice(action), action.k, 0.5, None)


def fake_execute(step) -> StepOutput:
    """What an executor reports, without tensors: a decode confirms 1 + k // 2 tokens, a prefill chunk computes its
    rows and the last chunk gives the first token; an admission without work holds its store hit."""
    output = StepOutput(ks=[w.k for w in step.decodes])
    for request in step.admitted:
        output.requests[request.id] = RequestOutput(cache_positions=request.computed)
    for work in step.decodes:
        n = 1 + work.k // 2
        output.requests[work.request.id] = RequestOutput([1] * n, len(work.request.tokens) + n - 1)
    for work in step.prefills:
        r, done = work.request, work.request.computed + work.rows
        output.requests[r.id] = RequestOutput([1] if done == len(r.tokens) else [], done)
    return output


def fake_request(i, prompt, new, k=0, decided=True):
    r = ServedRequest(id=str(i), arrival_s=0.0, prompt=list(range(prompt)), state=DecodeState(new, None, True))
    if decided:
        r.assign(Choice(Action(False, k)), k, 0.5, None)
    return r


def run_to_completion(scheduler, iterations=5000) -> list:
    steps = []
    for _ in range(iterations):
        if not scheduler.waiting and not scheduler.running:
            break
        step = scheduler.schedule()  # asserts its own invariants (budget, batch cap, K/V budget)
        steps.append(step)
        scheduler.update_from_output(step, fake_execute(step), 0.0)
    return steps


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 90), st.integers(1, 12), st.sampled_from([0, 2, 4])), min_size=1, max_size=10),
       st.integers(1, 64), st.integers(1, 6), st.integers(150, 3000), st.booleans())
def test_every_iteration_keeps_the_budgets_and_the_order_and_every_request_finishes(reqs, budget, batch, kv, chunking):
    scheduler = Scheduler(FakeKV(), FakeAdmission(), budget, batch, kv, chunking)
    requests = [fake_request(i, p, n, k) for i, (p, n, k) in enumerate(reqs)]
    scheduler.waiting = deque(requests)
    for _ in range(5000):
        if not scheduler.waiting and not scheduler.running:
            break
        step = scheduler.schedule()
        for r in step.refused:
            assert (len(r.prompt) + r.state.max_new_tokens + r.max_k) * 10 > kv and r.status == Status.REFUSED
        if not chunking and any(w.request in step.admitted for w in step.prefills):
            assert not step.decodes and len(step.prefills) == 1  # the baseline: a whole prefill alone
            assert step.prefills[0].rows == len(step.prefills[0].request.tokens) - step.prefills[0].request.computed
        decoding = [w.request for w in step.decodes]
        if chunking and step.prefills:  # decodes first: no decode left out while a prefill got rows
            assert all(r in decoding for r in scheduler.running if r.decoding and r not in step.preempted) \
                or step.rows == budget
        for request in scheduler.update_from_output(step, fake_execute(step), 0.0):
            assert request.status == Status.FINISHED and request not in scheduler.running
    assert all(r.status in (Status.FINISHED, Status.REFUSED) for r in requests)
    finished = [r.id for r in requests if r.status == Status.FINISHED]
    assert sorted(scheduler.kv.committed) == sorted(finished)  # each finished request committed once
    assert sorted(scheduler.kv.published) == sorted(finished)  # and its prompt published once, when computed


def test_the_newest_request_is_preempted_its_kv_freed_and_later_recomputed_with_its_output():
    kv = FakeKV(bpt=1)
    scheduler = Scheduler(kv, FakeAdmission(), token_budget=64, max_batch=4, kv_budget_bytes=70)
    old, new = fake_request(0, 30, 20), fake_request(1, 30, 20)
    scheduler.waiting = deque([old, new])
    preempted = [r for step in run_to_completion(scheduler, 200) for r in step.preempted]
    assert preempted and all(r is new for r in preempted) and new.preempted >= 1
    assert kv.freed.count(new.id) == new.preempted and old.id not in kv.freed
    assert old.status == new.status == Status.FINISHED and len(new.state.tokens) == 20


def test_admission_decides_once_with_the_stores_answer_before_the_request_is_sized():
    """The action is chosen at the first admission attempt, from the hit the K/V side reports: a reusing request
    starts with its hit computed, a non-reusing one from zero; a speculating request is sized with its draft's K/V
    (and refused when that makes it too large alone), which the scheduler could only learn from the decision."""
    kv = FakeKV(bpt=1, draft_bpt=1, hits={"0": 20, "1": 20})
    admission = FakeAdmission({"0": Action(True, 0), "1": Action(False, 0), "2": Action(False, 4)})
    scheduler = Scheduler(kv, admission, token_budget=64, max_batch=4, kv_budget_bytes=100)
    reuse, fresh, big = (fake_request(i, 30, n, decided=False) for i, n in enumerate((10, 10, 20)))
    scheduler.waiting = deque([reuse, fresh, big])
    step = scheduler.schedule()
    assert [r.id for r in step.admitted] == ["0", "1"] and [r.id for r in step.refused] == ["2"]
    assert reuse.computed == 20 and reuse.hit_tokens == 20 and fresh.computed == 0
    assert [(w.request.id, w.rows) for w in step.prefills] == [("0", 10), ("1", 30)]
    assert big.status == Status.REFUSED and "kv-budget-mib" in big.error  # (30 + 20 + 4) positions x 2 bytes > 100
    assert FakeKV(bpt=1).bytes_per_token(big) == 1 and kv.bytes_per_token(big) == 2  # sized with its draft
    run_to_completion(scheduler)
    assert [d[0] for d in admission.decided] == ["0", "1", "2"]  # once each, however many attempts
    assert reuse.status == fresh.status == Status.FINISHED


@pytest.mark.heavy
def test_a_prompt_is_shared_as_soon_as_it_is_computed_not_only_when_its_request_ends(tiny_pair, tmp_path):
    """A request sharing a running request's prompt reuses it while the first still decodes (the prompt's K/V is
    published when its first token comes out); both outputs stay the requests' alone."""
    from rakv.serving.trace import TraceRequest

    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    prompt = "The tower is 324 metres tall, about the same height as an 81-storey building, and the tallest"
    # the second arrives after the first's one-iteration prefill (a few ms), long before its 200 tokens are out
    trace = [TraceRequest("first", 0.0, prompt, 200), TraceRequest("second", 0.05, prompt + " structure in Paris", 4)]
    options = ServeOptions.default(strategy="kv-only", max_batch=2, ignore_eos=True, check_alone=True)
    summary = serve(engine, trace, tmp_path, options, progress=False)
    lines = {r["id"]: r for r in map(json.loads, ServedRunLayout(tmp_path).requests.read_text().splitlines())}
    assert lines["second"]["hit_tokens"] == lines["first"]["prompt_tokens"] - 1  # all but the next-token position
    assert lines["second"]["e2el_s"] + lines["second"]["arrival_s"] < lines["first"]["e2el_s"]  # ended first
    assert summary.outputs_equal_alone == 2


# --- exactness on the tiny pair ---

@pytest.fixture(scope="module")
def tiny_texts():
    from rakv.runtime.workloads import dataset_texts

    return dataset_texts("wikitext2")


def alone(pair, proposer, trace, outputs, strategy):
    """Each request through a fresh batch-one engine (empty store), with `strategy`'s action: the reference."""
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30), proposer=proposer)
    contexts, reference = {}, {}
    for request in trace:
        ids = (contexts.get(request.conversation, []) if request.follows else []) + engine.encode(request.prompt)
        result = engine.run(ids, action_of(strategy), request.max_new_tokens, ignore_eos=True)
        if request.conversation is not None:
            contexts[request.conversation] = ids + outputs.get(request.id, result.token_ids)
        reference[request.id] = result.token_ids
    return reference


def served(pair, proposer, trace, tmp_path, **options):
    engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30), proposer=proposer)
    summary = serve(engine, trace, tmp_path, ServeOptions.default(ignore_eos=True, **options), progress=False)
    records = [json.loads(line) for line in ServedRunLayout(tmp_path).requests.read_text().splitlines()]
    return summary, {r["id"]: r for r in records}


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["plain", "shared-prefix", "multi-turn"]), rate=st.sampled_from([5.0, 40.0, 400.0]),
       budget=st.integers(3, 80), batch=st.integers(1, 6), strategy=st.sampled_from(["ar", "kv-only", "spec-k2",
                                                                                     "joint-k4", "spec-k1"]),
       proposer=st.sampled_from(["draft", "prompt-lookup"]), kv_mib=st.sampled_from([0.6, 2.0, 64.0]),
       chunking=st.booleans(), seed=st.integers(0, 50),
       speculation=st.sampled_from(["per-request", "disable-by-batch-size:2", "k-by-batch:1=4,3=1"]))
def test_every_greedy_output_equals_the_request_served_alone(tiny_pair, tiny_texts, tmp_path_factory, kind, rate,
                                                             budget, batch, strategy, proposer, kv_mib, chunking, seed,
                                                             speculation):
    trace = generate_trace(tiny_texts, requests=6, rate=rate, kind=kind, max_new_tokens=9, prompt_words=25,
                           groups=2, system_words=30, turns=2, think_s=0.01, seed=seed)
    summary, records = served(tiny_pair, proposer, trace, tmp_path_factory.mktemp("serve"), strategy=strategy,
                              token_budget=budget, max_batch=batch, kv_budget_mib=kv_mib, chunking=chunking,
                              speculation=speculation)
    ok = {i: r["token_ids"] for i, r in records.items() if r["status"] == "ok"}
    reference = alone(tiny_pair, proposer, [r for r in trace if r.id in ok], ok, strategy)
    assert ok == reference
    counts = summary.statistics
    assert counts.completed == len(ok) and counts.completed + counts.failed == len(trace)
    refused = [r for r in records.values() if r["status"] == "refused"]
    assert all("K/V" in r["error"] or "refused" in r["error"] for r in refused)


def test_a_conversation_turn_hits_the_store_and_reuse_changes_no_output(tiny_pair, tiny_texts, tmp_path):
    trace = generate_trace(tiny_texts, requests=6, rate=50.0, kind="multi-turn", max_new_tokens=8, prompt_words=30,
                           turns=3, think_s=0.01, seed=2)
    summary, records = served(tiny_pair, "draft", trace, tmp_path, strategy="joint-k2", token_budget=24,
                              check_alone=True)
    assert summary.outputs_equal_alone == summary.statistics.completed == 6  # rakv.serving.replay agrees
    later = [r for r in records.values() if r["turn"] > 0]
    assert later and all(r["hit_tokens"] >= r["prompt_tokens"] // 2 for r in later)
    assert summary.statistics.prefix_hit_rate > 0.3
    ok = {i: r["token_ids"] for i, r in records.items()}
    assert ok == alone(tiny_pair, "draft", trace, ok, "joint-k2")


def test_summary_uses_vllm_names_and_counts_every_request(tiny_pair, tiny_texts, tmp_path):
    trace = generate_trace(tiny_texts, requests=5, rate=100.0, max_new_tokens=6, prompt_words=20, seed=1)
    summary, records = served(tiny_pair, "draft", trace, tmp_path, strategy="spec-k2", slos_ms={"ttft": 1e6})
    for name in ("completed", "failed", "duration_s", "request_throughput", "output_throughput",
                 "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                 "median_itl_ms", "p99_e2el_ms", "goodput", "mean_batch_tokens", "max_concurrency", "prefix_hit_rate"):
        assert name in summary.to_json(), name
    assert summary.statistics.goodput == pytest.approx(summary.statistics.request_throughput)  # every request meets
    # summary.json and iterations.jsonl are their records' JSON, read back to the same records
    assert ServedRunLayout(tmp_path).served_summary.read_text() == json.dumps(summary.to_json(), indent=1) + "\n"
    assert read_run_summary(ServedRunLayout(tmp_path).served_summary) == summary
    lines = ServedRunLayout(tmp_path).iterations.read_text().splitlines()
    assert [json.dumps(i.to_json()) for i in read_iterations(ServedRunLayout(tmp_path).iterations)] == lines
    assert len(lines) == summary.statistics.iterations
    bad = dict(summary.to_json(), completd=1)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(RakvError, match="bad.json: not a served run's summary.json \\(unknown field 'completd'\\)"):
        read_run_summary(tmp_path / "bad.json")
    record = next(iter(records.values()))
    assert set(record) >= {"id", "status", "error", "prompt_tokens", "hit_tokens", "new_tokens", "token_ids", "text",
                           "arrival_s", "ttft_s", "tpot_s", "itl_s", "e2el_s", "reuse", "k", "rounds", "accepted",
                           "preempted"}
    assert record["ttft_s"] > 0 and len(record["itl_s"]) <= record["new_tokens"] - 1


def test_bad_requests_are_refused_alone_and_the_others_served(tiny_pair, tmp_path):
    trace = [TraceRequest("ok1", 0.0, "The quick brown fox", 5), TraceRequest("empty", 0.0, "   ", 5),
             TraceRequest("long", 0.0, "The quick brown fox", 5000), TraceRequest("ok2", 0.01, "Jumps over it", 5),
             TraceRequest("c0", 0.0, "", 4, conversation="c", turn=0),
             TraceRequest("c1", 0.0, "Then what?", 4, conversation="c", turn=1, after_s=0.0)]
    summary, records = served(tiny_pair, "draft", trace, tmp_path, strategy="ar")
    assert {i for i, r in records.items() if r["status"] == "ok"} == {"ok1", "ok2"}
    assert records["empty"]["error"] == "empty prompt"
    assert "exceeds the model context" in records["long"]["error"]
    assert "was refused" in records["c1"]["error"]
    assert summary.statistics.completed == 2 and summary.statistics.failed == 4


# --- the command line ---

def rakv(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "rakv.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          **kwargs)


def test_a_malformed_trace_stops_serve_with_one_line_before_any_model_work(tmp_path):
    trace = write_lines(tmp_path, [GOOD, '{"id": "b", "arrival_s": 0, "prompt": "x", "max_new_tokens": -3}'])
    done = rakv("serve", "--pair", "tiny", "--trace", str(trace), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f'rakv: error: {trace}:2: field "max_new_tokens" must be an '
                                                f'integer > 0, got -3']
    assert not (tmp_path / "out").exists()


def test_kill_9_leaves_complete_lines_only(tmp_path):
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, [TraceRequest(f"r{i}", i * 0.15, f"Request number {i} says", 6) for i in range(200)], {})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "rakv.cli", "serve", "--pair", "tiny", "--trace", str(trace),
                             "--out", str(out), "--quiet", "--ignore-eos"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    lines = ServedRunLayout(out).requests
    deadline = time.time() + 120
    while time.time() < deadline and (not lines.exists() or lines.read_text().count("\n") < 3):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    text = lines.read_text()
    assert text.endswith("\n") and text.count("\n") >= 3
    assert all(json.loads(line)["status"] == "ok" for line in text.splitlines())
    assert not ServedRunLayout(out).served_summary.exists()


def test_rakv_trace_then_serve(tmp_path):
    trace = tmp_path / "t.jsonl"
    made = rakv("trace", "--out", str(trace), "--requests", "4", "--rate", "50", "--max-new-tokens", "4",
                "--prompt-words", "12", "--kind", "shared-prefix", "--groups", "2", "--system-words", "30")
    assert made.returncode == 0, made.stderr
    done = rakv("serve", "--pair", "tiny", "--trace", str(trace), "--out", str(tmp_path / "o"), "--quiet",
                "--strategy", "joint-k2", "--token-budget", "16", "--goodput", "ttft:100000")
    assert done.returncode == 0, done.stderr
    summary = read_run_summary(ServedRunLayout(tmp_path / "o").served_summary)
    assert summary.statistics.completed == 4 and summary.settings.token_budget == 16
    assert json.loads(done.stdout)["completed"] == 4


# --- SmolLM2 ---

@pytest.mark.slow
@pytest.mark.parametrize("strategy, proposer, budget", [("spec-k4", "draft", 32), ("joint-k4", "prompt-lookup", 48),
                                                        ("ar", "draft", 20)])
def test_smollm2_served_outputs_equal_alone(smollm2_pair, tmp_path, strategy, proposer, budget):
    from rakv.runtime.workloads import dataset_texts

    trace = generate_trace(dataset_texts("humaneval"), requests=5, rate=20.0, kind="plain", max_new_tokens=12,
                           prompt_words=45, seed=5)
    summary, records = served(smollm2_pair, proposer, trace, tmp_path, strategy=strategy, token_budget=budget,
                              max_batch=4)
    ok = {i: r["token_ids"] for i, r in records.items()}
    assert summary.statistics.completed == 5 and summary.statistics.max_concurrency > 1
    assert ok == alone(smollm2_pair, proposer, trace, ok, strategy)


@pytest.mark.parametrize("proposer, alpha", [("draft", 0.95), ("prompt-lookup", 0.9), ("draft", 0.05)])
def test_rakv_asd_decides_per_request_at_admission_and_changes_no_output(tiny_pair, tiny_texts, tmp_path, proposer,
                                                                         alpha):
    from test_costmodel import table

    from rakv.runtime.controller import Controller

    controller = Controller(table(alpha=alpha, step=0.02, verify=0.021, propose_per_token=0.0005))
    trace = generate_trace(tiny_texts, requests=6, rate=60.0, kind="shared-prefix", max_new_tokens=10,
                           prompt_words=20, groups=2, system_words=30, seed=4)
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer=proposer)
    serve(engine, trace, tmp_path, ServeOptions.default(strategy="rakv-asd", token_budget=40, ignore_eos=True),
          ServeParts(controller=controller), progress=False)
    records = {r["id"]: r for r in map(json.loads, ServedRunLayout(tmp_path).requests.read_text().splitlines())}
    assert controller.decisions == len(trace)
    ks = {r["k"] for r in records.values()}
    assert (ks != {0}) if alpha > 0.5 else (ks == {0})  # cheap verifies and high acceptance: it speculates
    ok = {i: r["token_ids"] for i, r in records.items()}
    assert ok == alone(tiny_pair, proposer, trace, ok, "ar")


@pytest.mark.parametrize("policy, decoding, expected", [
    ("per-request", 3, [4, 4, 2]), ("disable-by-batch-size:3", 2, [4, 4]), ("disable-by-batch-size:3", 3, [0, 0, 0]),
    ("k-by-batch:1=4,2=2,4=0", 1, [4]), ("k-by-batch:1=4,2=2,4=0", 3, [2, 2, 2]),
    ("k-by-batch:1=4,2=2,4=0", 5, [0] * 5),
])
def test_speculation_policies_cap_each_requests_k_by_the_load(policy, decoding, expected):
    from rakv.serving.policies import speculation_policy

    requests = [fake_request(i, 10, 20, k=4 if i != 2 else 2) for i in range(decoding)]
    assert speculation_policy(policy).depths(requests) == expected
    scheduler = Scheduler(FakeKV(), FakeAdmission(), 256, 8, 10 ** 9, speculation=speculation_policy(policy))
    for r in requests:
        r.status, r.computed = Status.RUNNING, 10
        r.state.emit([1])
    scheduler.running = requests
    assert [w.k for w in scheduler.schedule().decodes] == expected


@pytest.mark.parametrize("bad", ["per-request:3", "disable-by-batch-size:0", "disable-by-batch-size:x", "k-by-batch:",
                                 "k-by-batch:4", "k-by-batch:0=2", "always"])
def test_a_malformed_speculation_policy_is_refused(bad):
    from rakv.serving.policies import speculation_policy

    with pytest.raises(RakvError, match="--speculation takes"):
        speculation_policy(bad)


@pytest.mark.parametrize("overrides, message", [
    ({"token_budget": 0}, "must be positive"), ({"kv_budget_mib": -1}, "must be positive"),
    ({"itl_slo_ms": 0}, "--itl-slo-ms must be positive"), ({"acceptance": "oracle"}, "--acceptance takes"),
    ({"speculation": "always"}, "--speculation takes"), ({"strategy": "spec-kx"}, "strategy"),
    ({"check_alone": True, "sampling": Sampling(temperature=0.7)}, "--check-alone"),
    ({"sampling": Sampling(top_p=0.0)}, "--top-p"),
    ({"proposers": "draft,bogus"}, "unknown proposer 'bogus'"), ({"proposers": "draft,draft"}, "each proposer once"),
    ({"strategy": "heads:r1k4"}, "list it in --proposers"),
    ({"strategy": "rakv-asd", "proposers": "draft,heads", "acceptance": "prefix"}, "with several --proposers"),
    ({"proposer_choice": "fastest"}, "--proposer-choice takes"),
    ({"strategy": "rakv-asd", "proposer_choice": "service"}, "chooses among several --proposers"),
])
def test_serve_options_check_themselves_once_with_one_line(overrides, message):
    with pytest.raises(RakvError, match=message):
        ServeOptions.default(**overrides)


def test_serve_options_take_their_defaults_from_conf_serving():
    from rakv.runtime.paths import conf_file

    node, options = conf_file("serving/default.yaml"), ServeOptions.default()
    for name in ("strategy", "token_budget", "chunking", "max_batch", "kv_budget_mib", "speculation", "itl_slo_ms",
                 "acceptance"):
        assert getattr(options, name) == node[name], name
    assert ServeOptions.from_config(node, max_batch=3).max_batch == 3


def test_a_served_hit_reuses_the_drafts_state_and_keeps_the_output(tiny_pair, tiny_texts, tmp_path):
    """Entries a speculating request left in the store (target and draft K/V) are reused by a served joint-k2
    request on an exact repeat and on a partial hit: its draft starts from the stored positions, its output is
    the one it gets alone, and with draft reuse off the same requests find no draft state."""
    trace = generate_trace(tiny_texts, requests=4, rate=1000.0, kind="plain", seed=2, prompt_words=30,
                           max_new_tokens=8)
    trace = [TraceRequest(r.id, 0.0, r.prompt, r.max_new_tokens) for r in trace]
    draft_hits = {}
    for reuse_draft in (True, False):
        engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), reuse_draft=reuse_draft)
        first = engine.encode(trace[0].prompt)
        engine.run(first, Action(False, 1), 1, ignore_eos=True)  # an earlier speculating request: exact repeat
        second = engine.encode(trace[1].prompt)
        engine.run(second[:20] + [t + 1 for t in second[20:40]], Action(False, 1), 1, ignore_eos=True)  # q = 20
        out = tmp_path / str(reuse_draft)
        summary = serve(engine, trace, out, ServeOptions.default(strategy="joint-k2", ignore_eos=True,
                                                                 check_alone=True), progress=False)
        records = {r["id"]: r for r in map(json.loads, ServedRunLayout(out).requests.read_text().splitlines())}
        assert summary.outputs_equal_alone == len(trace)
        draft_hits[reuse_draft] = {i: (r["hit_tokens"], r["draft_hit_tokens"]) for i, r in records.items()}
    first_id, second_id = trace[0].id, trace[1].id
    hit, draft = draft_hits[True][first_id]
    assert hit == draft == len(engine.encode(trace[0].prompt))  # exact repeat: every position, both models
    assert draft_hits[True][second_id] == (19, 19)  # a partial hit of q = 20: q - 1 positions, both models
    assert all(d == 0 for _, d in draft_hits[False].values())


def test_a_preempted_request_still_stores_its_prompt_when_it_completes(tiny_pair, tiny_texts, tmp_path):
    """Preemption drops a request's K/V, not what its completion stores: its prompt (from the logits its first
    prefill gave) and its prompt + output are in the store afterwards, as for a request never preempted."""
    trace = generate_trace(tiny_texts, requests=16, rate=1000.0, kind="shared-prefix", seed=3, groups=2,
                           system_words=60, prompt_words=30, max_new_tokens=12)
    trace = [TraceRequest(r.id, 0.0, r.prompt, r.max_new_tokens) for r in trace]
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    serve(engine, trace, tmp_path, ServeOptions.default(strategy="joint-k2", token_budget=24, kv_budget_mib=1.6,
                                                        ignore_eos=True), progress=False)
    records = {r["id"]: r for r in map(json.loads, ServedRunLayout(tmp_path).requests.read_text().splitlines())}
    preempted = [r for r in records.values() if r["preempted"]]
    assert preempted, "the K/V budget should preempt at least one request"
    for r in records.values():
        assert engine.peek(r["prompt_ids"]).exact, f"{r['id']} (preempted {r['preempted']}): prompt not stored"
        assert engine.peek(r["prompt_ids"] + r["token_ids"][:-1]).exact


@dataclass
class HiddenStateLookup(PromptLookupProposer):
    """Prompt lookup that asks for the target's last hidden states, as a proposer drafting from them (EAGLE, Medusa
    heads) would, and records what it is given: (first position, rows, width) per verify."""

    name: ClassVar[str] = "hidden-state-lookup"
    needs_target_hidden: ClassVar[bool] = True
    made: ClassVar[list] = []
    seen: list = field(default_factory=list)

    def __post_init__(self):
        HiddenStateLookup.made.append(self)

    def observe_target_hidden(self, first_position, hidden):
        self.seen.append((first_position, *hidden.shape))


def test_a_proposer_that_asks_is_given_the_targets_hidden_states_alone_and_served(tiny_pair, tiny_texts, tmp_path,
                                                                                 monkeypatch):
    """The hook of rakv.runtime.decoding.Proposer.needs_target_hidden: every verify's rows, alone (Engine.run) and
    served (the executor's batched forward) the same, and nothing else changes."""
    monkeypatch.setitem(PROPOSERS, HiddenStateLookup.name, HiddenStateLookup)
    monkeypatch.setattr(HiddenStateLookup, "made", [])
    trace = generate_trace(tiny_texts, requests=5, rate=400.0, kind="shared-prefix", max_new_tokens=10,
                           prompt_words=25, groups=2, system_words=30, seed=4)
    summary, records = served(tiny_pair, HiddenStateLookup.name, trace, tmp_path, strategy="spec-k2", token_budget=64)
    _, plain = served(tiny_pair, "prompt-lookup", trace, tmp_path / "plain", strategy="spec-k2", token_budget=64)
    assert {i: r["token_ids"] for i, r in records.items()} == {i: r["token_ids"] for i, r in plain.items()}
    assert [records[i]["rounds"] for i in records] == [plain[i]["rounds"] for i in records]
    served_seen = sorted(tuple(p.seen) for p in HiddenStateLookup.made)
    HiddenStateLookup.made.clear()
    ok = {i: r["token_ids"] for i, r in records.items()}
    assert ok == alone(tiny_pair, HiddenStateLookup.name, trace, ok, "spec-k2")
    alone_seen = sorted(tuple(p.seen) for p in HiddenStateLookup.made)
    width = tiny_pair.target.module.config.hidden_size
    assert served_seen == alone_seen and len(alone_seen) == len(trace)
    for seen in alone_seen:
        assert seen and all(w == width and 1 <= rows <= 3 for _, rows, w in seen)
        assert all(b[0] > a[0] for a, b in zip(seen, seen[1:]))  # each verify starts after the last's first row


def test_served_acceptance_is_learnt_per_temperature_and_a_prefix_records_greedy_rounds_only():
    """A sampled request's rounds teach its temperature's EWMA, never the greedy one; a prefix's record is greedy
    acceptance, so a sampled request passes its prefix's record on and adds nothing, and reads none at admission."""
    acceptance = Acceptance(source="prefix")
    sampled = ServedRequest(id="s", arrival_s=0.0, prompt=[1, 2, 3], state=DecodeState(8, None, True),
                            sampling=Sampling(temperature=1.0, seed=1), prefix_acceptance=(3.0, 1.0))
    greedy = ServedRequest(id="g", arrival_s=0.0, prompt=[1, 2, 3], state=DecodeState(8, None, True),
                           prefix_acceptance=(3.0, 1.0))
    before = acceptance.tracker.alpha
    for _ in range(20):
        acceptance.learn(sampled, [(4, 0)], 0)
    assert acceptance.tracker.alpha == before and acceptance.tracker_at(1.0).alpha < before
    assert Acceptance.recorded(sampled, [(4, 4)]) == (3.0, 1.0)
    assert Acceptance.recorded(greedy, [(4, 4)]) == (7.0, 1.0)
    hit = Hit(3, prefix_length=3, acceptance=(30.0, 0.0))
    assert acceptance.at_admission(hit) > acceptance.at_admission(hit, temperature=1.0)
    assert acceptance.at_admission(hit, temperature=1.0) == acceptance.tracker_at(1.0).alpha


@pytest.fixture(scope="module")
def smollm2_q4_1_pair():
    from conftest import THREADS

    from rakv.runtime.models import load_pair

    return load_pair("smollm2", threads=THREADS, precision="q4_1")


@pytest.mark.slow
@pytest.mark.parametrize("strategy, proposer, budget", [("spec-k4", "draft", 32), ("joint-k4", "prompt-lookup", 48)])
def test_smollm2_at_q4_1_served_outputs_equal_alone(smollm2_q4_1_pair, tmp_path, strategy, proposer, budget):
    """The target at the precision users run (the shipped GGUF's Q4_1 blocks) served under continuous batching, at two
    token budgets: every output equals the request's greedy output alone at that precision."""
    from rakv.runtime.calibration import precision_of
    from rakv.runtime.workloads import dataset_texts

    assert precision_of(smollm2_q4_1_pair) == "q4_1"
    trace = generate_trace(dataset_texts("humaneval"), requests=5, rate=20.0, kind="plain", max_new_tokens=12,
                           prompt_words=45, seed=6)
    summary, records = served(smollm2_q4_1_pair, proposer, trace, tmp_path, strategy=strategy, token_budget=budget,
                              max_batch=4)
    ok = {i: r["token_ids"] for i, r in records.items()}
    assert summary.statistics.completed == 5 and summary.statistics.max_concurrency > 1
    assert ok == alone(smollm2_q4_1_pair, proposer, trace, ok, strategy)
