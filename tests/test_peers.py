"""The vLLM peer's pure parts (the peer itself needs its own venv: scripts/setup_vllm_peer.sh, never in CI): the
schedule scripts/tune_vllm.py derives from measured steps (rakv.bench.peers), and the peer scripts' one output
agreement."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from rakv.bench import peers
from rakv.bench.peer_reports import Agreement, ClientOutput, ClientRun, RepeatRecord, StepPoint
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import to_json

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tune = peers  # scripts/tune_vllm.py's step model and schedule live in rakv.bench.peers


def steps_of(fixed: float, per_request: float, per_row: float, match: float = 1.0) -> list[StepPoint]:
    return [StepPoint(k=k, b=b, step_s=fixed + per_request * b + per_row * b * (1 + k * match),
                      draft_rows_per_step=b * k * match, steps=32.0)
            for b in (1, 2, 4, 8, 16) for k in (0, 2, 4)]


def test_the_fit_recovers_the_step_model_it_was_measured_from():
    model = tune.fit(steps_of(0.030, 0.002, 0.0005))
    assert np.allclose(model, [0.030, 0.002, 0.0005], rtol=1e-6)


def test_the_schedule_speculates_where_rows_are_cheap_and_stops_where_they_are_not():
    # rows nearly free at small batches (a fixed, bandwidth-bound part dominates), dear at large ones
    model = np.array([0.030, 0.0, 0.008])
    table = tune.schedule(model, [0, 2, 4], alpha=0.8, match=1.0, max_batch=16)
    assert table[0][0] == 1 and table[0][2] > 0 and table[-1][2] == 0 and table[-1][1] == 1024
    assert all(a[1] + 1 == b[0] for a, b in zip(table, table[1:])), "ranges must be contiguous"
    assert [k for _, _, k in table] == sorted((k for _, _, k in table), reverse=True)
    assert tune.schedule(model, [0, 2, 4], alpha=0.0, match=1.0, max_batch=16) == [[1, 1024, 0]]
    for b in range(1, 17):  # every batch size gets the k of highest predicted rate
        best = max([0, 2, 4], key=lambda k: tune.rate(model, b, k, 0.8, 1.0))
        assert tune.k_of(table, b) == best


def test_the_schedule_becomes_vllm_s_config():
    assert tune.config(0, 3) is None and tune.config([[1, 1024, 0]], 3) is None
    fixed = tune.config(2, 3)
    assert fixed.method == "ngram" and fixed.num_speculative_tokens == 2 and fixed.prompt_lookup_max == 3
    assert to_json(fixed) == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
                              "prompt_lookup_max": 3}  # vLLM's speculative_config, as the job carries it
    table = [[1, 4, 4], [5, 1024, 0]]
    scheduled = tune.config(table, 3)
    assert scheduled.num_speculative_tokens == 4 and scheduled.num_speculative_tokens_per_batch_size == table


@pytest.mark.parametrize("theirs, equal, where", [
    ({"a": [1, 2, 3], "b": [4, 5]}, 2, []),
    ({"a": [1, 9, 3], "b": [4, 5]}, 1, ["a at token 1"]),
    ({"a": [1, 2], "b": [4, 5]}, 1, ["a at token 2"]),
])
def test_bench_serving_counts_equal_outputs_and_says_where_others_diverge(theirs, equal, where):
    assert peers.agreement({"a": [1, 2, 3], "b": [4, 5]}, theirs) == (equal, where)


def test_bench_vllm_serve_compares_texts_and_finds_the_divergence_by_token():
    bench = script("bench_vllm_serve")
    tokenizer = type("Words", (), {"encode": staticmethod(str.split)})()
    ours = ClientOutput(client_run(30.0, 200.0), ["a b c", "d e", "f"], None)
    theirs = ClientOutput(client_run(30.0, 200.0), ["a b c", "d x", "f g"], None)
    assert bench.text_agreement(ours, theirs, tokenizer) == Agreement(1, 3, 0, [
        "request 1 at token 1", "request 2 at token 1"])
    # a request one engine failed has no text to compare: counted apart, never as a divergence
    lost = ClientOutput(ours.run, ours.generated_texts, ["", "", "Connection reset by peer"])
    assert bench.text_agreement(lost, theirs, tokenizer) == Agreement(1, 2, 1, ["request 1 at token 1"])


def client_run(throughput: float, ttft_p50: float, ttft_p99: float = 600.0, hits: float = 0.421) -> ClientRun:
    return ClientRun(completed=32, failed=0, output_throughput=throughput, p50_ttft_ms=ttft_p50,
                     p99_ttft_ms=ttft_p99, p50_tpot_ms=48.0, p99_tpot_ms=75.0, p50_itl_ms=40.0, p99_itl_ms=224.0,
                     mean_e2el_ms=1500.0, p99_e2el_ms=2500.0, prefix_hit_rate=hits)


def test_the_client_s_result_is_read_into_its_record_keeping_what_rakv_reads():
    result = {"completed": 3, "failed": 1, "output_throughput": 9.0, "p50_ttft_ms": 1.0, "p99_ttft_ms": 2.0,
              "p50_tpot_ms": 3.0, "p99_tpot_ms": 4.0, "p50_itl_ms": 5.0, "p99_itl_ms": 6.0, "mean_e2el_ms": 7.0,
              "p99_e2el_ms": 8.0, "ttfts": [0.1, 0.2], "generated_texts": ["a", "b", ""], "errors": ["", "", "x"],
              "a_field_of_a_later_vllm": 1}
    output = ClientOutput.of_client(result, 0.5, "r.json")
    assert output.run.output_throughput == 9.0 and output.run.prefix_hit_rate == 0.5
    assert output.generated_texts == ["a", "b", ""] and output.errors == ["", "", "x"]
    assert "ttfts" not in to_json(output.run) and "date" not in to_json(output.run)  # lists and absent fields
    with pytest.raises(RakvError, match="r.json: missing field 'p99_e2el_ms'"):
        ClientOutput.of_client({k: v for k, v in result.items() if k != "p99_e2el_ms"}, None, "r.json")


def test_the_tuned_schedule_and_smartspec_share_one_choice_of_k():
    from rakv.serving.policies import most_goodput

    model = np.array([0.030, 0.0, 0.008])
    for b in (1, 4, 16):
        rates = {k: tune.rate(model, b, k, 0.8, 1.0) for k in (0, 2, 4)}
        assert most_goodput((4, 0, 2), rates.__getitem__) == max(rates, key=rates.get)


def test_the_paper_s_peer_rows_are_the_shipped_measurements(tmp_path):
    """prose_serving.peer_section renders bench_vllm_serve's summary over repeats (means with their t intervals, the
    paired ratios in words from their CIs), bench_serving's files and tune_vllm's check as the paper's rows, numbers
    as measured; without results it writes a comment only."""
    import json

    from rakv.bench.options import ServingBenchOptions
    from rakv.bench.peer_reports import (
        ConcurrencyRow,
        EngineSetting,
        Machine,
        ServingBenchArgs,
        ServingBenchReport,
        VllmServeSummary,
    )
    from rakv.experiments import peer_tables as pt
    from rakv.experiments.prose_serving import peer_section
    from rakv.runtime.json_records import write_record
    from rakv.runtime.run_layout import PeerLayout

    peer = PeerLayout(tmp_path)
    assert peer_section(None).startswith("%")
    ours = [client_run(t, 200.0 + d) for t, d in [(30.0, 0), (31.0, 10), (32.0, 20)]]
    theirs = [client_run(t, 400.0 + d, 600.0 + d, hits=0.3) for t, d in [(30.0, 0), (30.5, 40), (33.0, 10)]]
    repeats = [RepeatRecord({"rakv": {"plain-1": a}, "vllm": {"plain-1": b}},
                            {"vllm": {"plain-1": Agreement(31, 32, 0, [])}}) for a, b in zip(ours, theirs)]
    summary = VllmServeSummary(
        settings={"rakv": EngineSetting("rakv", None), "vllm": EngineSetting("vllm", 0)}, workloads={"plain-1": 1.0},
        repeats=repeats, aggregate=pt.serve_aggregates(repeats), paired=pt.serve_paired(repeats), requests=32,
        new_tokens=32, strategy="kv-only", seeds=[0, 1000, 2000], vllm="0.32.0",
        machine=Machine("AMD EPYC", 2, "2026-12-02"))
    write_record(summary, peer.vllm_serve_summary)
    text = peer_section(tmp_path)
    assert ("plain & 1 & rakv serve & 96 & 0 & 31.0$\\pm$2.5 & 210$\\pm$25 & 600$\\pm$0 & 48$\\pm$0 & "
            "1500$\\pm$0 & 2500$\\pm$0 & 42") in text
    assert "93 of 96 requests" in text and "3 repeats" in text and "OMP\\_NUM\\_THREADS=2" in text
    # rakv's TTFT p50 is lower in every repeat (paired): better; tok/s spans 1
    assert "rakv better on TTFT p50" in text and "the CI spans 1 on" in text and "tok/s" in text
    assert "tab:tune" not in text and "every request arriving at once" not in text
    row = ConcurrencyRow(vllm_tok_s=65.0, ours_over_vllm=2.0, vllm_tok_s_runs=[65.0, 66.0, 64.0], vllm_equal=16,
                         vllm_divergences=[], vllm_start_s=30.0, concurrency=8, ours_tok_s=130.0,
                         sequential_tok_s=40.0, transformers_tok_s=None, ours_tok_s_runs=[130.0, 128.0, 133.0],
                         ours_over_sequential=3.25, ours_over_transformers=None, scheduler_share=0.01,
                         mean_batch_rows=8.0, sequential_prefill_share=0.2, amdahl_over_sequential=3.3)
    options = ServingBenchOptions(repeats=3, peer="vllm", proposer="draft", token_budget=256, kv_budget_mib=512)
    report = ServingBenchReport(pair="smollm2", strategy="ar", proposer="draft", requests=16, new_tokens=32,
                                token_budget=256, rows=[row], outputs_equal_alone=True, limits=None, row_costs=None,
                                vllm="0.32.0", vllm_ngram=0, args=ServingBenchArgs.of(options, False, "ar.json"))
    write_record(report, peer.bench_serving_dir / "ar.json")
    tune = {"vllm": "0.32.0", "model": {"fixed_s": 0.03, "per_request_s": 0.001, "per_row_s": 0.0005}, "alpha": 0.42,
            "match_rate": 0.58, "steps": [], "hand": [[1, 1024, 0]], "schedule": [[1, 3, 2], [4, 1024, 0]],
            "check": [{"config": c, "c": n, "tok_s": t, "tpot_s": None}
                      for c, n, t in [("tuned", 1, 20.0), ("k=0", 1, 15.0), ("k=2", 1, 19.0)]]}
    peer.tune_dir.mkdir()
    peer.tune.write_text(json.dumps(tune))
    text = peer_section(tmp_path)
    ratio = pt.row_statistics(row).ours_over_vllm_ci
    assert f"{ratio[0]:.2f} [{ratio[1]:.2f}, {ratio[2]:.2f}] at $c=8$" in text and "default threads" in text
    assert "$k=2$ for batches 1--3, $k=0$ for batches 4--up" in text and "tuned & 20.0" in text
    assert "above k = 0 by more than that noise" in text
