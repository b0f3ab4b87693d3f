"""The heads' acceptance priced per candidate position (rakv.runtime.costmodel.expected_tokens_by_position, the
controller's per-position EWMAs) and the per-request choice of (reuse, proposer, k) over all three proposers
(docs/heads.md)."""

from __future__ import annotations

import pytest
from test_costmodel import configured, table

from rakv.runtime.cache import Hit
from rakv.runtime.controller import AcceptanceTracker, Controller, ProposerChoice
from rakv.runtime.costmodel import expected_tokens_by_position, expected_tokens_per_round


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_equal_position_acceptance_is_the_one_alpha_model(alpha, k):
    assert expected_tokens_by_position([alpha] * max(k, 1), k) == pytest.approx(expected_tokens_per_round(alpha, k))


def test_falling_position_acceptance_confirms_fewer_tokens():
    assert expected_tokens_by_position([0.8, 0.4, 0.2, 0.1], 4) == pytest.approx(1 + 0.8 + 0.32 + 0.064 + 0.0064)
    assert expected_tokens_by_position([0.8, 0.4], 4) < expected_tokens_per_round(0.8, 4)
    assert expected_tokens_by_position([0.8], 3) == pytest.approx(expected_tokens_per_round(0.8, 3))  # the last held


def test_the_tracker_learns_each_position_from_the_rounds_that_reached_it():
    tracker = AcceptanceTracker(0.5, 0.5, positions=3)
    tracker.observe([(3, 1)] * 30)  # position 1 always accepted, position 2 always rejected, 3 never reached
    first, second, third = tracker.position_alphas
    assert first > 0.99 and second < 0.01 and third == 0.5
    again = AcceptanceTracker(0.5, 0.5, positions=3)
    again.restore(tracker.state)
    assert again.state == tracker.state and again.position_alphas == tracker.position_alphas
    plain = AcceptanceTracker(0.5, 0.5)
    plain.observe([(3, 1)] * 30)
    assert plain.state == tracker.state[:3] and plain.position_alphas == []


def test_per_position_pricing_stops_where_the_heads_stop_accepting():
    """Rounds whose first candidate always passes and whose second never does: per position, a deeper k buys
    nothing (k = 1); the one alpha (0.5 here) over the same rounds would speculate deeper (the positive control)."""
    k_set = configured(k_set=(0, 1, 2, 4))
    rounds = [(4, 1)] * 400  # (the EWMA weight of the past is 0.97 by default)
    by_position = Controller(table(alpha=0.6, propose_per_token=0.0001), k_set, per_position=True)
    one_alpha = Controller(table(alpha=0.6, propose_per_token=0.0001), k_set)
    for controller in (by_position, one_alpha):
        controller.observe(rounds)
    hit = Hit(prompt_length=100)
    assert by_position.decide(100, hit, 64).action.k == 1
    assert one_alpha.decide(100, hit, 64).action.k > 1


def test_without_per_position_pricing_the_controller_decides_as_before():
    k_set = configured(k_set=(0, 1, 2, 4, 8))
    for alpha in (0.1, 0.6, 0.95):
        plain, flagged = (Controller(table(alpha=alpha), k_set), Controller(table(alpha=alpha), k_set))
        for controller in (plain, flagged):
            controller.observe([(4, 2), (4, 4), (2, 0)])
        hit = Hit(prompt_length=300, prefix_length=250)
        assert plain.decide(300, hit, 64).predictions == flagged.decide(300, hit, 64).predictions


def test_the_heads_are_narrowed_with_their_per_position_acceptance():
    k_set = configured(k_set=(0, 1, 2, 4, 8))
    heads = Controller(table(alpha=0.6, propose_per_token=0.0001), k_set, per_position=True)
    heads.observe([(4, 1)] * 400)
    name, decision = ProposerChoice({"heads": heads}, {"heads": 4}).decide(100, Hit(prompt_length=100), 64)
    assert name == "heads" and decision.action.k == 1


def test_teacher_forced_labels_are_the_targets_own_greedy_tokens(tiny_pair):
    """Over a prompt and the target's greedy continuation of it, head i's label at every position of the continuation
    is the text's token t+1+i, consistent or not; on text the target would not write, `consistent` keeps fewer labels
    (the positive control: without it every position in range is labelled, with the target's argmax there)."""
    from rakv.experiments.heads import teacher_forced
    from rakv.runtime.actions import Action
    from rakv.runtime.cache import PrefixKVStore
    from rakv.runtime.engine import Engine

    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    prompt = engine.encode("The history of the city begins in")
    greedy = engine.run(prompt, Action(False, 0), 21, ignore_eos=True).token_ids
    text, further = prompt + greedy[:20], prompt + greedy  # the label past the text's end: the target's next choice
    first = len(prompt) - 1  # position first produced greedy[0]: from there on the text is the target's own choice
    for consistent in (True, False):
        for token in (False, True):
            [(hidden, following, labels)] = teacher_forced(tiny_pair, [text], 3, consistent, token)
            assert hidden.shape[0] == labels.shape[0] == following.shape[0]
            tail = labels[-(len(text) - 1 - first):]  # rows of positions first .. len - 2 (each has a head-1 label)
            assert following[-(len(text) - 1 - first):].tolist() == text[first + 1:]
            for row, t in zip(tail, range(first, len(text) - 1)):
                for i in range(1, 4):
                    assert int(row[i - 1]) == (further[t + 1 + i] if t + 1 + i <= len(text) else -1)
    scrambled = [text[0]] + list(reversed(text[1:]))
    [(_, _, strict)] = teacher_forced(tiny_pair, [scrambled], 3, True)
    [(_, _, told)] = teacher_forced(tiny_pair, [scrambled], 3, True, token=True)
    [(_, _, loose)] = teacher_forced(tiny_pair, [scrambled], 3, False)
    assert int((strict >= 0).sum()) < int((told >= 0).sum()) < int((loose >= 0).sum())
    assert int((loose >= 0).sum()) == sum(len(scrambled) - i for i in range(1, 4))
    # heads told the following token learn the target's next choice after any token: head 1 everywhere in range
    assert int((told[:, 0] >= 0).sum()) == len(scrambled) - 1


def test_a_choice_built_from_calibrations_prices_only_the_heads_per_position():
    k_set = configured(k_set=(0, 1, 2, 4))
    choice = ProposerChoice.of({"draft": table(), "prompt-lookup": table(), "heads": table()}, k_set, {"heads": 4})
    assert {n: c.per_position for n, c in choice.controllers.items()} == {"draft": False, "prompt-lookup": False,
                                                                          "heads": True}
    assert choice.max_k == {"heads": 4}
    with pytest.raises(Exception, match="unknown proposer"):
        ProposerChoice.of({"medusa": table()}, k_set)


def test_a_retrained_set_is_calibrated_again(tiny_pair, monkeypatch):
    """The heads' calibration key holds the shipped set's key (a stale calibration's acceptance is another set's);
    the other proposers' keys are as before."""
    from rakv.runtime import heads as heads_module
    from rakv.runtime.calibration import calibration_key, key_digest
    from rakv.runtime.heads import read_heads_record
    from rakv.runtime.run_layout import HeadsLayout

    shipped = read_heads_record(HeadsLayout.shipped("tiny")).key
    key = calibration_key(tiny_pair, "heads")
    assert key["heads"] == shipped and "heads" not in calibration_key(tiny_pair, "draft")
    monkeypatch.setattr(heads_module, "shipped_heads_key", lambda name: "another-set")
    assert key_digest(calibration_key(tiny_pair, "heads")) != key_digest(key)


def test_a_greedy_request_teaches_prompt_lookup_the_rounds_it_would_have_run():
    """Of several proposers, a finished greedy request served by one teaches prompt lookup (whose greedy rounds an
    output fixes) the rounds lookup would have run over it, so a proposer the choice never picks still learns
    (rakv.serving.acceptance.Acceptance.learn); the draft, which does not replay, learns only from its own rounds; a
    sampled request teaches no other proposer; lookup's own request is not counted twice."""
    from types import SimpleNamespace

    from rakv.runtime.decoding import Sampling
    from rakv.serving.acceptance import Acceptance

    k_set = configured(k_set=(0, 1, 2, 4))
    prompt, output = [1, 2, 3, 4, 5, 6, 7, 8] * 3, [1, 2, 3, 4, 5, 6, 7, 8] * 2  # lookup proposes the output exactly

    def served(proposer, temperature=0.0, log=()):
        choice = SimpleNamespace(decision=object(), depth=None, proposer=proposer)
        return SimpleNamespace(prompt=prompt, state=SimpleNamespace(tokens=output), choice=choice, proposer=proposer,
                               sampling=Sampling(temperature=temperature)), list(log)

    def states(acceptance):
        return {n: c.tracker.state for n, c in acceptance.controller.controllers.items()}

    def fresh():
        return Acceptance("ewma", ProposerChoice.of({"draft": table(alpha=0.3), "prompt-lookup": table(alpha=0.3)},
                                                    k_set))

    acceptance = fresh()
    before = states(acceptance)
    request, log = served("draft", log=[(4, 0)] * 4)
    acceptance.learn(request, log, 0)
    lookup = acceptance.controller.controllers["prompt-lookup"].tracker
    assert lookup.alpha > 0.45 and lookup.state != before["prompt-lookup"]  # learnt: every candidate passes
    assert acceptance.controller.controllers["draft"].tracker.alpha < 0.3  # its own rejected rounds only

    sampled = fresh()
    request, log = served("draft", temperature=0.7, log=[(4, 0)] * 4)
    sampled.learn(request, log, 0)
    assert states(sampled)["prompt-lookup"] == before["prompt-lookup"]

    own, alone = fresh(), fresh()
    request, log = served("prompt-lookup", log=[(4, 4)] * 3)
    own.learn(request, log, 0)
    alone.controller.controllers["prompt-lookup"].observe(log, 0)
    assert states(own) == states(alone)
