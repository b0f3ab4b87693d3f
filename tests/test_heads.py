"""Learned heads (rakv.runtime.heads) and their stage (rakv.experiments.heads) on the tiny seeded pair: trained in
seconds, greedy output identical to AR alone and served, rollback-safe, sampled output distributed as AR's, cached
by content, and refused with one line when they do not fit."""

import json

import numpy as np
import pytest
import torch

from rakv.experiments.heads import ensure_heads, mixed_texts, settings_of, train, training_prompts
from rakv.runtime import heads as heads_module
from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.decoding import Sampling
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.heads import HeadsProposer, HeadsSettings, load_heads, read_heads_record, target_identity
from rakv.runtime.proposers import PROPOSERS
from rakv.runtime.run_layout import HeadsLayout

PROMPTS = ("The history of the city begins in", "def fibonacci(n):\n    if n < 2:\n        return n\n",
           "In 1998 the band released its second album,")
SMALL = HeadsSettings(pair="tiny", heads=3, vocab=512, prompts=4, prompt_tokens=8, new_tokens=30, epochs=30, batch=32,
                      lr=0.01, token=True, seed=0)  # the shipped design: the heads also read the produced token


@pytest.fixture(scope="module")
def engine(tiny_pair):
    return Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="heads")


@pytest.fixture(scope="module")
def trained(tiny_pair, engine):
    """Heads fitted to the target's continuations of PROMPTS (so that rounds accept some candidates and reject
    others on them)."""
    prompts = [engine.encode(p) for p in PROMPTS]
    heads, record = train(tiny_pair, SMALL, prompts + prompts[:1], "test", log=lambda *_: None)
    assert heads.token_weight is not None
    return heads


@pytest.fixture(scope="module")
def medusa(tiny_pair, engine):
    """The same, as Medusa-1 heads (reading the hidden state alone: `token: false`, the ablation)."""
    prompts = [engine.encode(p) for p in PROMPTS]
    heads, _ = train(tiny_pair, HeadsSettings(**{**SMALL.__dict__, "token": False}), prompts + prompts[:1], "test",
                     log=lambda *_: None)
    assert heads.token_weight is None
    return heads


def test_heads_are_registered_and_ask_for_the_targets_hidden_states():
    assert PROPOSERS["heads"] is HeadsProposer and HeadsProposer.needs_target_hidden


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("design", ["trained", "medusa"])
def test_greedy_output_equals_ar_and_rounds_accept_and_reject(engine, request, design, k):
    trained = request.getfixturevalue(design)
    accepted = rejections = 0
    for text in PROMPTS:  # 40 tokens: past the 30 the heads were fitted to, where they guess
        ids = engine.encode(text)
        ar = engine.run(ids, Action(False, 0), 40, ignore_eos=True)
        spec = engine.run(ids, Action(False, k), 40, ignore_eos=True, proposer=HeadsProposer(trained))
        assert spec.token_ids == ar.token_ids
        assert all(proposed <= min(k, trained.count) for proposed, _ in spec.round_log)
        accepted, rejections = accepted + spec.accepted, rejections + spec.rejections
    assert accepted > 0 and rejections > 0  # both branches of a round ran


def test_reuse_and_an_exact_repeat_change_no_output(tiny_pair, trained):
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="heads")
    ids = engine.encode(PROMPTS[0])
    ar = engine.run(ids, Action(False, 0), 20, ignore_eos=True).token_ids
    for prompt in (ids, ids, ids[:-2] + ids[-1:]):  # miss, exact repeat, partial hit
        out = engine.run(prompt, Action(True, 3), 20, ignore_eos=True, proposer=HeadsProposer(trained))
        assert out.token_ids == engine.run(prompt, Action(False, 0), 20, ignore_eos=True).token_ids
    assert engine.run(ids, Action(True, 3), 20, ignore_eos=True, proposer=HeadsProposer(trained)).token_ids == ar


class OffByOne(HeadsProposer):
    """The positive control: reads the hidden state one position too early, as a proposer that mistook which verify
    row belongs to the last confirmed token would."""

    def hidden_at(self, position):
        return super().hidden_at(position - 1)


class ReadsTheTokenBefore(HeadsProposer):
    """The positive control for the token the heads read: the one before the last confirmed token."""

    def propose(self, context, k, sampling, generator):
        return super().propose(list(context[:-2]) + [context[-2], context[-2]], k, sampling, generator)


@pytest.mark.parametrize("design", ["trained", "medusa"])
def test_the_hidden_state_of_the_last_confirmed_token_is_the_one_read(engine, request, design):
    """Trained heads accept on their training prompts from the right row; reading a neighbouring row accepts less
    (the check can fail), while greedy output stays the target's either way."""
    trained = request.getfixturevalue(design)
    right = wrong = 0
    for text in PROMPTS:
        ids = engine.encode(text)
        right += engine.run(ids, Action(False, 3), 24, ignore_eos=True, proposer=HeadsProposer(trained)).accepted
        wrong += engine.run(ids, Action(False, 3), 24, ignore_eos=True, proposer=OffByOne(trained)).accepted
    assert right > wrong


def test_the_token_the_heads_read_is_the_last_confirmed_one(engine, trained, monkeypatch):
    """Heads that read the token are told the context's last token (the one their hidden state produced), and it
    changes what they propose; the positive control, a proposer that tells them the token before, is caught."""
    width = trained.weight.shape[1]
    hidden = torch.randn(width, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(trained.logits(hidden, 3, 5), trained.logits(hidden, 3, 6))
    told, seen = [], []
    original = type(trained).logits
    monkeypatch.setattr(type(trained), "logits",
                        lambda self, h, n, token=None: told.append(token) or original(self, h, n, token))

    def spying(kind):
        class Spy(kind):
            def propose(self, context, k, sampling, generator):
                if self.hidden_at(len(context) - 2) is not None:
                    seen.append(int(context[-1]))
                return super().propose(context, k, sampling, generator)
        return Spy

    for kind, right in ((HeadsProposer, True), (ReadsTheTokenBefore, False)):
        told.clear(), seen.clear()
        for text in PROMPTS:
            engine.run(engine.encode(text), Action(False, 3), 24, ignore_eos=True, proposer=spying(kind)(trained))
        assert told and len(told) == len(seen) and (told == seen) is right


def test_rollback_keeps_only_confirmed_positions(trained):
    proposer = HeadsProposer(trained)
    width = trained.weight.shape[1]
    rows = torch.arange(5, dtype=torch.float32)[:, None].expand(5, width)
    proposer.observe_target_hidden(10, rows)  # positions 10..14
    assert float(proposer.hidden_at(12)[0]) == 2.0 and proposer.hidden_at(15) is None
    proposer.rollback(13)  # positions 13 and 14 withdrawn
    assert proposer.hidden_at(13) is None and float(proposer.hidden_at(12)[0]) == 2.0
    proposer.rollback(10)
    assert proposer.hidden_at(10) is None and proposer.propose(list(range(12)), 3, Sampling(), None) == ([], None)


def test_a_sampled_proposal_is_a_distribution_over_the_candidate_vocabulary(trained):
    proposer = HeadsProposer(trained)
    proposer.observe_target_hidden(0, torch.randn(3, trained.weight.shape[1]))
    tokens, dists = proposer.propose([1, 2, 3], 3, Sampling(temperature=0.7, seed=1), torch.Generator().manual_seed(1))
    assert dists.shape == (3, trained.vocab_size) and torch.allclose(dists.sum(-1), torch.ones(3))
    outside = torch.ones(trained.vocab_size, dtype=torch.bool)
    outside[trained.vocab] = False
    assert float(dists[:, outside].sum()) == 0.0 and all(dists[i, t] > 0 for i, t in enumerate(tokens))


def test_served_greedy_output_equals_alone_with_the_same_rounds(tiny_pair, trained, tmp_path, monkeypatch):
    from rakv.runtime.workloads import dataset_texts
    from rakv.serving.server import ServeOptions, serve
    from rakv.serving.trace import generate_trace

    monkeypatch.setattr(heads_module, "shipped_heads", lambda pair: trained)
    trace = generate_trace(dataset_texts("wikitext2"), requests=5, rate=400.0, kind="shared-prefix",
                           max_new_tokens=10, prompt_words=20, groups=2, system_words=20, seed=4)
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="heads")
    serve(engine, trace, tmp_path, ServeOptions.default(ignore_eos=True, strategy="spec-k4", token_budget=64,
                                                       max_batch=4), progress=False)
    from rakv.runtime.run_layout import ServedRunLayout

    records = [json.loads(line) for line in ServedRunLayout(tmp_path).requests.read_text().splitlines()]
    alone = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="heads")
    assert len(records) == len(trace) and all(r["status"] == "ok" for r in records)
    by_id = {r.id: r for r in trace}
    for record in records:
        result = alone.run(alone.encode(by_id[record["id"]].prompt), Action(False, 4), 10, ignore_eos=True)
        assert record["token_ids"] == result.token_ids
        assert record["rounds"] == result.rounds


def test_shipped_tiny_heads_fit_the_tiny_target(tiny_pair):
    layout = HeadsLayout.shipped("tiny")
    record = read_heads_record(layout)
    assert record.target == target_identity(tiny_pair) and len(record.loss_curve) == record.settings.epochs
    heads = load_heads(tiny_pair, layout)
    assert heads.count == record.settings.heads and len(heads.vocab) == record.vocab_size
    assert (heads.token_weight is not None) == record.settings.token


def test_the_shipped_sets_are_what_their_configs_train():
    """Each shipped set's settings are its conf/heads/<pair>.yaml's (a changed config without a retrained set fails
    here, before a fresh clone would retrain it in the pipeline)."""
    from omegaconf import OmegaConf

    for pair in ("tiny", "smollm2"):
        record = read_heads_record(HeadsLayout.shipped(pair))
        assert record.settings == settings_of(OmegaConf.load(f"conf/heads/{pair}.yaml")), pair


def test_heads_for_another_target_are_refused_with_one_line(tiny_pair, tmp_path):
    layout = HeadsLayout(tmp_path / "other")
    shipped = HeadsLayout.shipped("tiny")
    layout.root.mkdir()
    record = json.loads(shipped.record.read_text())
    record["target"]["weights"] = "another"
    layout.record.write_text(json.dumps(record))
    layout.tensors.write_bytes(shipped.tensors.read_bytes())
    with pytest.raises(RakvError, match="another target"):
        load_heads(tiny_pair, layout)


def test_the_stage_trains_once_then_finds_its_key_in_the_cache(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("RAKV_CACHE_DIR", str(tmp_path))
    settings = HeadsSettings(pair="tiny", heads=2, vocab=64, prompts=3, prompt_tokens=8, new_tokens=6, epochs=1,
                             batch=16)
    lines: list[str] = []
    first = ensure_heads(tiny_pair, settings, "test", install=False, log=lines.append)
    assert any("training" in line for line in lines)
    lines.clear()
    assert ensure_heads(tiny_pair, settings, "test", install=False, log=lines.append) == first
    assert not any("training" in line for line in lines) and any("cache" in line for line in lines)
    other = ensure_heads(tiny_pair, HeadsSettings(**{**settings.__dict__, "seed": 1}), "test", install=False,
                         log=lines.append)
    assert other != first  # the seed is part of the key
    record = read_heads_record(first)
    assert record.positions > 0 and 0 < record.coverage <= 1 and len(record.holdout_accuracy) == 2
    assert record.texts == "wikitext2: bundled validation"


def test_a_record_names_the_python_whose_library_it_read():
    import platform

    from rakv.runtime.heads import data_origin

    assert data_origin(HeadsSettings(dataset="wikitext2+python")) == (
        f"wikitext2: bundled validation; python: the Python {platform.python_version()} standard library")
    assert data_origin(HeadsSettings(dataset="python", source="/src")) == "python: /src"


def test_training_is_seeded(tiny_pair):
    settings = HeadsSettings(pair="tiny", heads=2, vocab=64, prompts=3, prompt_tokens=8, new_tokens=6, epochs=2,
                             batch=16)
    prompts = training_prompts(tiny_pair.tokenizer.encode, settings)
    a, _ = train(tiny_pair, settings, prompts, "test", log=lambda *_: None)
    b, _ = train(tiny_pair, settings, prompts, "test", log=lambda *_: None)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.vocab, b.vocab)


def test_a_mixture_takes_each_dataset_in_turn_in_its_own_seeded_order(tmp_path):
    (tmp_path / "valid.txt").write_text("".join(f" prose {i} .\n" for i in range(6)))
    (tmp_path / "code.py").write_text("".join(f"def f{i}():\n    pass\n" for i in range(3)))
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    alone = {name: mixed_texts(encode, HeadsSettings(dataset=name, source=str(tmp_path), seed=3))
             for name in ("wikitext2", "python")}
    mixed = mixed_texts(encode, HeadsSettings(dataset="wikitext2+python", source=str(tmp_path), seed=3))
    assert sorted(alone["wikitext2"]) == sorted(encode(f"prose {i} .") for i in range(6))
    assert mixed == [alone["wikitext2"][0], alone["python"][0], alone["wikitext2"][1], alone["python"][1],
                     alone["wikitext2"][2], alone["python"][2], *alone["wikitext2"][3:]]
    with pytest.raises(RakvError, match="unknown dataset 'wikitext3'"):
        mixed_texts(encode, HeadsSettings(dataset="wikitext2+wikitext3", source=str(tmp_path)))


@pytest.mark.parametrize("node, message", [({"pair": "tiny", "heds": 3}, "unknown setting"),
                                           ({"pair": "tiny", "heads": 0}, "heads >= 1"),
                                           ({"pair": "tiny", "holdout": 1.5}, "holdout")])
def test_bad_settings_fail_with_one_line(node, message):
    with pytest.raises(RakvError, match=message):
        settings_of(node)


def test_the_stage_refuses_a_bad_override_with_one_line():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "scripts/run_stage.py", "heads", "heads=tiny", "heads.heads=0"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "heads >= 1" in done.stderr.strip().splitlines()[-1]



# The distribution tests (tests/test_sampling_engine.py's design): at positions sampled after a rejection, the token's
# marginal over many seeds is AR sampling's, under both verification rules; the positive control is a proposer that
# draws from its heads but tells the verifier another distribution (uniform, so nearly every candidate passes), whose
# output follows the heads instead of the target, which must be seen. (Hiding the distribution, i.e. claiming a point
# mass, would not do: verification against a point mass is exact whatever chose the candidate.)
RUNS = 200
NEW_TOKENS = 5
POSITIONS = (2, 3, 4)
SAMPLING = dict(temperature=0.6, top_p=1.0)  # (top-p: tests/test_sampling_engine.py; a sort per row here)


class MisstatesItsDistribution(HeadsProposer):
    def propose(self, context, k, sampling, generator):
        tokens, dists = super().propose(context, k, sampling, generator)
        return tokens, (torch.full_like(dists, 1.0 / dists.shape[-1]) if dists is not None else None)


def sampled(engine, k, make, verify="token", seed0=0):
    ids = engine.encode(PROMPTS[0])
    out, rejected_before = [], []
    for seed in range(seed0, seed0 + RUNS):
        result = engine.run(ids, Action(False, k), NEW_TOKENS, ignore_eos=True, proposer=make() if k else None,
                            sampling=Sampling(seed=seed, verify=verify, **SAMPLING))
        out.append(result.token_ids)
        confirmed, first = 1, None
        for proposed, accepted in result.round_log:
            if accepted < proposed and first is None:
                first = confirmed + accepted
            confirmed += accepted + 1
        rejected_before.append(first)
    return np.array(out), rejected_before


@pytest.fixture(scope="module")
def ar_samples(engine):
    return sampled(engine, 0, None)[0]


@pytest.mark.parametrize("verify", ["token", "block"])
def test_sampled_heads_follow_ar_sampling_after_rejections(engine, trained, ar_samples, verify):
    from test_sampling_engine import two_sample_pvalue

    spec, rejected_before = sampled(engine, 3, lambda: HeadsProposer(trained), verify, seed0=10_000)
    for position in POSITIONS:
        assert sum(r is not None and r <= position for r in rejected_before) >= RUNS // 6
        assert two_sample_pvalue(ar_samples[:, position], spec[:, position]) > 0.001


def test_the_distribution_test_sees_a_proposer_that_misstates_its_distribution(engine, trained, ar_samples):
    from test_sampling_engine import two_sample_pvalue

    wrong, _ = sampled(engine, 3, lambda: MisstatesItsDistribution(trained), seed0=20_000)
    assert min(two_sample_pvalue(ar_samples[:, p], wrong[:, p]) for p in POSITIONS) < 1e-4


# The proposer chosen per request (rakv.runtime.controller.ProposerChoice, rakv.runtime.strategies).


def test_one_proposers_choice_decides_exactly_as_its_controller():
    from test_costmodel import configured, table

    from rakv.runtime.cache import Hit
    from rakv.runtime.controller import Controller, ProposerChoice

    for alpha in (0.1, 0.6, 0.95):
        alone = Controller(table(alpha=alpha), configured(k_set=(0, 1, 2, 4, 8)))
        choice = ProposerChoice({"draft": Controller(table(alpha=alpha), configured(k_set=(0, 1, 2, 4, 8)))})
        for prompt, hit in ((200, Hit(prompt_length=200)), (300, Hit(prompt_length=300, prefix_length=250))):
            expected = alone.decide(prompt, hit, 64)
            name, decision = choice.decide(prompt, hit, 64)
            assert name == "draft" and decision.action == expected.action
            assert decision.predictions == expected.predictions


def test_the_cheapest_proposer_wins_and_the_heads_get_no_deeper_k_than_they_have():
    from test_costmodel import configured, table

    from rakv.runtime.cache import Hit
    from rakv.runtime.controller import Controller, ProposerChoice

    k_set = configured(k_set=(0, 1, 2, 4, 6, 8))
    controllers = {"draft": Controller(table(alpha=0.5, propose_per_token=0.004), k_set),
                   "heads": Controller(table(alpha=0.9, propose_per_token=0.0001), k_set)}
    name, decision = ProposerChoice(controllers, {"heads": 4}).decide(100, Hit(prompt_length=100), 64)
    assert name == "heads" and 0 < decision.action.k <= 4
    assert any(label.startswith("draft:") for label in decision.predictions)
    name, _ = ProposerChoice(controllers).decide(100, Hit(prompt_length=100), 64)
    assert name == "heads"
    slow = {"draft": Controller(table(alpha=0.9, propose_per_token=0.0001), k_set),
            "heads": Controller(table(alpha=0.05, propose_per_token=0.004), k_set)}
    assert ProposerChoice(slow, {"heads": 4}).decide(100, Hit(prompt_length=100), 64)[0] == "draft"
    hopeless = {"heads": Controller(table(alpha=0.01, propose_per_token=0.01), k_set)}
    assert ProposerChoice(hopeless, {"heads": 4}).decide(100, Hit(prompt_length=100), 64)[1].action.k == 0


def test_choosing_the_proposer_per_request_keeps_greedy_output_and_learns_per_proposer(tiny_pair, trained,
                                                                                       monkeypatch):
    from test_costmodel import configured, table

    from rakv.runtime.controller import Controller, ProposerChoice
    from rakv.runtime.strategies import run_choosing_proposer

    monkeypatch.setattr(heads_module, "shipped_heads", lambda pair: trained)
    k_set = configured(k_set=(0, 2, 4))
    choice = ProposerChoice({"draft": Controller(table(alpha=0.6, propose_per_token=0.003), k_set),
                             "prompt-lookup": Controller(table(alpha=0.3, propose_per_token=0.0), k_set),
                             "heads": Controller(table(alpha=0.8, propose_per_token=0.0002), k_set)},
                            {"heads": trained.count})
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="draft")
    reference = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    ran = []
    for text in PROMPTS * 2:
        ids = engine.encode(text)
        result = run_choosing_proposer(engine, choice, ids, 16, ignore_eos=True)
        assert result.token_ids == reference.run(ids, Action(False, 0), 16, ignore_eos=True).token_ids
        ran.append(result.proposer)
    assert "heads" in ran and choice.controllers["heads"].tracker.alpha != 0.8  # its rounds taught it
    assert choice.controllers["draft"].tracker.alpha == 0.6 or "draft" in ran


def test_calibration_prices_the_heads_proposal_from_a_hidden_state(tiny_pair, trained, tmp_path, monkeypatch):
    from rakv.runtime.calibration import CalibrationPlan, calibrate

    monkeypatch.setattr(heads_module, "shipped_heads", lambda pair: trained)
    offered = []
    original = HeadsProposer.propose

    def counting(self, context, k, sampling, generator):
        out = original(self, context, k, sampling, generator)
        offered.append((k, len(out[0])))
        return out

    monkeypatch.setattr(HeadsProposer, "propose", counting)
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="heads")
    quick = CalibrationPlan(prefill_lengths=(16,), contexts=(32,), k_values=(1, 2, 4), copy_lengths=(16,), repeats=1,
                            acceptance_prompts=1, acceptance_new_tokens=8, refuse_spread=100.0)
    cost = calibrate(engine, [engine.encode(PROMPTS[0])], quick, progress=False)
    timed = [(k, n) for k, n in offered if k in (1, 2)]  # (the acceptance rounds propose k = 4)
    assert len(timed) >= 4 and all(n == k for k, n in timed)  # every timed proposal offered its candidates
    assert set(cost.propose) == {1, 2, 4} and cost.proposer_kv_bytes_per_token == 0.0


def test_a_heads_calibration_key_is_a_study_record(tiny_pair):
    """The heads' calibration key names their set (a retrained set is another proposer), and the study's metadata
    reads it back (rakv.experiments.metadata.CalibrationKey), as it reads every other proposer's."""
    from rakv.experiments.metadata import CalibrationKey
    from rakv.runtime.calibration import calibration_key

    key = calibration_key(tiny_pair, "heads")
    assert key["heads"] == read_heads_record(HeadsLayout.shipped("tiny")).key
    assert CalibrationKey.of(key).heads == key["heads"] and CalibrationKey.of(key).proposal == key["proposal"]
    assert not CalibrationKey.of(calibration_key(tiny_pair, "draft")).heads


def test_served_choice_among_proposers_mixes_kinds_in_a_batch_and_keeps_greedy_output(tiny_pair, trained, tmp_path,
                                                                                       monkeypatch):
    """rakv serve choosing the proposer per request (rakv-asd over a ProposerChoice): the choice is forced in turn here,
    so that iterations batch all three kinds together; every output is the greedy AR one, each record names its
    proposer, each request holds a proposer of its own kind (the draft's K/V only for a draft request), and its rounds
    teach that proposer's controller only."""
    from test_costmodel import configured, table

    from rakv.runtime.controller import Controller, ProposerChoice
    from rakv.runtime.run_layout import ServedRunLayout
    from rakv.runtime.workloads import dataset_texts
    from rakv.serving.executor import Executor
    from rakv.serving.server import ServeOptions, ServeParts, serve
    from rakv.serving.trace import generate_trace

    monkeypatch.setattr(heads_module, "shipped_heads", lambda pair: trained)
    names = ("draft", "prompt-lookup", "heads")
    k_set = configured(k_set=(0, 2))
    choice = ProposerChoice({n: Controller(table(alpha=0.7, propose_per_token=0.0), k_set) for n in names})
    before = {n: c.tracker.state for n, c in choice.controllers.items()}
    turns = iter(range(1 << 20))

    def in_turn(self, prompt_tokens, hit, new_tokens, temperature=0.0):
        name = names[next(turns) % len(names)]
        return name, self.controllers[name].decide(prompt_tokens, hit, new_tokens, temperature=temperature)

    monkeypatch.setattr(ProposerChoice, "decide", in_turn)
    batches, execute = [], Executor.execute

    def spied(self, step):
        output = execute(self, step)
        batches.append(set(output.kinds))
        speculating = [w.request for w in step.decodes if w.k]
        assert all(self.kv.slot(r).proposer.name == r.proposer for r in speculating)  # a proposer of its own kind
        bytes_of = {r.proposer: self.kv.bytes_per_token(r) for r in speculating}
        if "draft" in bytes_of:
            assert all(b < bytes_of["draft"] for n, b in bytes_of.items() if n != "draft")
        return output

    monkeypatch.setattr(Executor, "execute", spied)
    trace = generate_trace(dataset_texts("wikitext2"), requests=9, rate=400.0, kind="plain", max_new_tokens=12,
                           prompt_words=20, seed=5)
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30), proposer="draft")
    options = ServeOptions.default(ignore_eos=True, strategy="rakv-asd", proposers="draft,prompt-lookup,heads",
                                   speculation="per-request", token_budget=64, max_batch=6)
    serve(engine, trace, tmp_path, options, ServeParts(controller=choice), progress=False)
    records = [json.loads(line) for line in ServedRunLayout(tmp_path).requests.read_text().splitlines()]
    reference = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    by_id = {r.id: r for r in trace}
    assert len(records) == len(trace) and all(r["status"] == "ok" for r in records)
    for record in records:
        ids = reference.encode(by_id[record["id"]].prompt)
        assert record["token_ids"] == reference.run(ids, Action(False, 0), 12, ignore_eos=True).token_ids
        assert record["k"] == 2 and record["proposer"] in names
    assert {r["proposer"] for r in records} == set(names)
    assert any(kinds == set(names) for kinds in batches)  # one batched iteration proposed with all three kinds
    for name in ("draft", "heads"):
        assert choice.controllers[name].tracker.state != before[name], name  # its own requests' rounds taught it


@pytest.mark.parametrize("design", ["trained", "medusa"])
def test_the_packed_proposal_is_the_heads_function(request, design):
    """On the compact kernels (CPU) the proposal's products run through the engine's packed GEMM
    (rakv.runtime.heads.PackedHeads): the same logits as torch's products up to fp32 summation order, the same
    candidates, for every number of heads."""
    from rakv.runtime.heads import head_logits

    trained = request.getfixturevalue(design)
    assert trained.packed is not None  # the tiny pair runs on the compact kernels: the packed path is the one used
    generator = torch.Generator().manual_seed(3)
    for n in range(1, trained.count + 1):
        hidden = torch.randn(trained.rows.shape[1], generator=generator)
        token = int(trained.vocab[n])
        embedded = trained.embed(torch.tensor([token])) if trained.token_weight is not None else None
        reference = head_logits(hidden.reshape(1, -1), trained.weight[:n], trained.bias[:n], trained.vocab_bias[:n],
                                trained.rows, embedded, None if trained.token_weight is None else
                                trained.token_weight[:n])[0]
        packed = trained.logits(hidden, n, token)
        assert packed.shape == reference.shape == (n, trained.rows.shape[0])
        torch.testing.assert_close(packed, reference, rtol=1e-4, atol=1e-4)
        assert torch.equal(packed.argmax(-1), reference.argmax(-1))


def bench_heads_script():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_heads", Path(__file__).resolve().parents[1] / "scripts" / "bench_heads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("workload", ["humaneval", "structured"])
def test_bench_heads_reads_each_held_out_workloads_prompts_whole_and_seeded(workload):
    """The acceptance per head position is measured on HumanEval and the JSON workload too: their prompts whole (a
    WikiText-2 paragraph is cut to the prompt length); the same seed gives the same prompts, another seed others."""
    bench = bench_heads_script()
    encode = lambda text: [ord(c) for c in text]  # noqa: E731 - one token per character: the prompt's length is its text's
    texts = {tuple(encode(t)) for _, t in bench.dataset_texts(workload)}
    first = bench.held_out_prompts(encode, 5, 64, seed=0, workload=workload)
    assert len(first) == 5 and all(tuple(p) in texts for p in first)
    assert first == bench.held_out_prompts(encode, 5, 64, seed=0, workload=workload)
    assert first != bench.held_out_prompts(encode, 5, 64, seed=1, workload=workload)
    cut = bench.held_out_prompts(encode, 5, 64, seed=0)
    assert all(len(p) == 64 for p in cut)  # the control: WikiText-2's paragraphs are cut
