"""The sampling stage's statistics (rakv.experiments.sampling_stats) on synthetic tables whose truth is known."""

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest

from rakv.experiments import sampling_stats as ss
from rakv.experiments.summary_sampling import DISTRIBUTION_SAMPLES
from rakv.experiments.verdicts import CheckVerdict
from rakv.runtime.json_records import ABSENT
from rakv.runtime.verification import accept_biased, closed_form_moments


def test_holm_matches_the_step_down_by_hand():
    adjusted = ss.holm([0.01, 0.04, 0.03, 0.5])
    # sorted 0.01, 0.03, 0.04, 0.5 -> 0.04, 0.09, 0.09 (monotone), 0.5
    assert np.allclose(adjusted, [0.04, 0.09, 0.09, 0.5])


def test_t_interval_covers_at_its_nominal_level():
    rng = np.random.default_rng(0)
    covered = sum(low <= 1.0 <= high for _, low, high in
                  (ss.t_interval(rng.lognormal(0, 0.3, 8) / np.exp(0.045)) for _ in range(2000)))
    assert 0.92 <= covered / 2000 <= 0.98, covered / 2000


def test_the_token_test_tells_a_shifted_distribution_from_the_same_one():
    rng = np.random.default_rng(1)
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    same = ss.token_test(rng.choice(4, 300, p=probs).tolist(), rng.choice(4, 300, p=probs).tolist())
    shifted = ss.token_test(rng.choice(4, 300, p=probs).tolist(),
                            rng.choice(4, 300, p=[0.7, 0.2, 0.08, 0.02]).tolist())
    assert same > 0.01 and shifted < 1e-4


def test_the_biased_rule_overweights_the_argmax_and_the_closed_form_counts_reached_positions():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]], dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    draws = [accept_biased([0], p, generator)[0] for _ in range(2000)]  # the candidate is the argmax: always kept
    assert set(draws) == {0}
    draws = [accept_biased([1], p, generator)[0] for _ in range(4000)]  # not the argmax: drawn from p_0
    assert binomtest(sum(d == 0 for d in draws), len(draws), 0.5).pvalue > 1e-3
    # rounds (verified, accepted): the first reached 2 positions (one rejected), the second all 3
    mean, variance = closed_form_moments([(3, 1), (3, 3)], [(0.9, 0.5, 0.1), (0.8, 0.7, 0.6)])
    assert mean == pytest.approx(1.4 + 2.1)
    assert variance == pytest.approx(0.09 + 0.25 + 0.16 + 0.21 + 0.24)


def synthetic_runs(rng, shift: float = 0.0, requests: int = 60) -> pd.DataFrame:
    """Rounds of k = 4 whose candidates pass with the probability the rows record (plus `shift`)."""
    rows = []
    for r in range(requests):
        accepted = rejections = 0
        closed = variance = 0.0
        for _ in range(8):
            alphas = rng.uniform(0.3, 0.9, 4)
            for a in alphas:
                closed += a
                variance += a * (1 - a)
                if rng.random() < min(a + shift, 1.0):
                    accepted += 1
                else:
                    rejections += 1
                    break
        rows.append({"configuration": "c", "temperature": 1.0, "verify": "token", "k": 4, "strategy": "spec-k4",
                     "accepted": accepted, "rejections": rejections, "closed_form_accepted": closed,
                     "closed_form_variance": variance,
                     "prompt_id": f"p{r % 4}", "seed_index": r // 4})
    return pd.DataFrame(rows)


def test_the_closed_form_interval_covers_and_a_shift_is_seen():
    rng = np.random.default_rng(2)
    verdicts = [ss.closed_form_checks(synthetic_runs(rng, requests=8))[0].verdict for _ in range(400)]
    assert 0.92 <= verdicts.count("agrees") / len(verdicts) <= 0.98  # a 95 % interval, 8 requests
    (differs,) = ss.closed_form_checks(synthetic_runs(rng, shift=0.15))
    assert differs.verdict == "differs" and differs.difference[1] > 0


def greedy_runs(rng, requests: int = 4, verify: str = "greedy") -> pd.DataFrame:
    """Greedy rounds as the engine logs them: alpha_j is 1 where the candidate is the target's argmax, else 0, so the
    closed form of the reached positions is the accepted count itself, and its variance 0."""
    rows = []
    for r in range(requests):
        accepted = int(rng.integers(8, 30))
        rows.append({"configuration": "c", "temperature": 0.0, "verify": verify, "k": 4, "strategy": "spec-k4",
                     "accepted": accepted, "rejections": 4, "closed_form_accepted": float(accepted),
                     "closed_form_variance": 0.0, "prompt_id": f"p{r}", "seed_index": 0})
    return pd.DataFrame(rows)


def test_a_check_that_cannot_fail_is_refused_as_agreement():
    rng = np.random.default_rng(7)
    (greedy,) = ss.closed_form_checks(greedy_runs(rng))
    (token,) = ss.closed_form_checks(synthetic_runs(rng, requests=8))
    assert greedy.verdict == CheckVerdict.IDENTITY and token.verdict in (CheckVerdict.AGREES, CheckVerdict.DIFFERS)
    # the rule reads the interval, not the rule's name: a token-wise cell whose alphas are all 0 or 1 is one too
    (certain,) = ss.closed_form_checks(greedy_runs(rng, verify="token").assign(temperature=1.0))
    assert certain.verdict == CheckVerdict.IDENTITY
    tally = ss.agreement_tally([greedy, certain, token])
    assert (tally.judged, tally.identities) == (1, 2) and tally.agree == (token.verdict == CheckVerdict.AGREES)
    # planted: a check that cannot fail, labelled "agrees", is refused whatever its label says
    planted = dataclasses.replace(greedy, verdict=CheckVerdict.AGREES)
    assert ss.agreement_tally([planted]) == ss.CheckTally(0, 0, 1, 0, 0, 0)
    # a greedy cell whose bookkeeping is off differs: it can fail that way, and then counts as a failure
    broken = greedy_runs(rng)
    broken.loc[0, "closed_form_accepted"] += 1.0
    (off,) = ss.closed_form_checks(broken)
    assert off.verdict == CheckVerdict.DIFFERS and ss.agreement_tally([off]) == ss.CheckTally(0, 1, 0, 0, 0, 0)
    # a block cell of a summary from before its expectation given the drafts ("bound") is not judged
    old = dataclasses.replace(token, verify="block", verdict="bound", expectation=ABSENT)
    assert ss.agreement_tally([old]).not_judged == 1 and ss.agreement_tally([old]).judged == 0


def block_runs(rng, shift: float = 0.0, requests: int = 8, rounds: int = 8) -> pd.DataFrame:
    """Block rounds of k = 4 whose accepted count has the mean the rows record as the block rule's expectation given
    the draft (plus `shift`), and token-wise's expectation 0.3 lower (block keeps more on these drafts)."""
    rows = []
    for r in range(requests):
        expected = rng.uniform(0.5, 3.5, rounds)
        accepted = rng.binomial(4, np.clip((expected + shift) / 4, 0, 1))
        rows.append({"configuration": "c", "temperature": 1.0, "verify": "block", "k": 4, "strategy": "spec-k4",
                     "accepted": int(accepted.sum()), "rejections": int((accepted < 4).sum()),
                     "closed_form_accepted": float((expected - 0.3).sum()), "closed_form_variance": 1.0,
                     "expected_accepted_block": float(expected.sum()),
                     "expected_accepted_token": float((expected - 0.3).sum()), "prompt_id": f"p{r}", "seed_index": 0})
    return pd.DataFrame(rows)


def test_block_cells_are_judged_against_their_expectation_given_the_drafts():
    rng = np.random.default_rng(9)
    verdicts = [ss.closed_form_checks(block_runs(rng))[0].verdict for _ in range(400)]
    assert 0.92 <= verdicts.count(CheckVerdict.AGREES) / len(verdicts) <= 0.985  # a 95 % t interval over 8 requests
    (cell,) = ss.closed_form_checks(block_runs(rng, requests=60))
    assert cell.expectation == ss.GIVEN_THE_DRAFTS and cell.degrees_of_freedom == 59
    assert cell.verdict == CheckVerdict.AGREES
    # the same cell against token-wise's expectation: above it, the check tells the two rules apart
    assert cell.versus_token[1] > 0
    (shifted,) = ss.closed_form_checks(block_runs(rng, shift=-0.4, requests=60))
    assert shifted.verdict == CheckVerdict.DIFFERS and shifted.difference[2] < 0
    (alone,) = ss.closed_form_checks(block_runs(rng, requests=1))
    assert alone.verdict == CheckVerdict.NOT_JUDGED and alone.degrees_of_freedom is None
    assert ss.closed_form_checks(block_runs(rng).drop(columns="expected_accepted_block")) == []


def test_the_distribution_samples_are_checked_with_the_biased_control_apart():
    rng = np.random.default_rng(12)
    arms = []
    for arm, frame in (("token", synthetic_runs(rng, requests=40)), ("block", block_runs(rng, requests=40)),
                       ("biased", synthetic_runs(rng, shift=-0.3, requests=40))):
        frame = frame.rename(columns={"verify": "arm", "expected_accepted_block": "expected_block",
                                      "expected_accepted_token": "expected_token"}).assign(arm=arm)
        arms.append(frame.assign(expected_block=frame.get("expected_block", 0.0)))
    checks = ss.distribution_checks(pd.concat(arms + [arms[0].assign(arm="plain", k=0)]))
    by = {c.verify: c for c in checks}
    assert set(by) == {"token", "block", "biased"} and all(c.source == DISTRIBUTION_SAMPLES for c in checks)
    assert by["biased"].control and by["biased"].verdict == CheckVerdict.DIFFERS and not by["token"].control
    tally = ss.agreement_tally(checks)
    assert (tally.controls, tally.controls_rejected, tally.judged) == (1, 1, 2)
    assert ss.distribution_checks(pd.concat(arms).drop(columns="expected_block")) == []


def samples(rng, arm: str, bias: float, prompts: int = 3, seeds: int = 80) -> list[dict]:
    rows = []
    for prompt in range(prompts):
        base = np.array([0.4, 0.3, 0.2, 0.1])
        probs = base + bias * (np.eye(4)[0] - base)  # bias moves mass to token 0 (the argmax)
        for seed in range(seeds):
            tokens = rng.choice(4, 4, p=probs).tolist()
            rows.append({"configuration": "c", "temperature": 1.0, "arm": arm, "prompt_id": f"p{prompt}",
                         "seed_index": seed, "tokens": json.dumps(tokens),
                         "loglik": float(np.log(base[tokens]).sum()), "argmax_tokens": tokens.count(0)})
    return rows


def test_the_distribution_tests_have_power_against_the_control_and_keep_their_level():
    rng = np.random.default_rng(3)
    frame = pd.DataFrame(samples(rng, "plain", 0.0) + samples(rng, "token", 0.0) + samples(rng, "biased", 0.5))
    found = {t.arm: t for t in ss.distribution_tests(frame, resamples=100)}
    assert found["biased"].rejected and found["biased"].half_sample_rejection_rate >= 0.9
    assert not found["token"].rejected and found["token"].half_sample_rejection_rate <= 0.15
    assert found["biased"].control and not found["token"].control


def test_simultaneous_intervals_widen_each_cell_by_bonferroni():
    from rakv.experiments.prose_sampling import family_agreement
    from rakv.experiments.summary_sampling import ClosedFormCheck

    def check(low):
        return ClosedFormCheck("c", 1.0, "token", 4, 8, 200, [0.9, 0.85, 0.95], 0.87, [0.035, low, 0.0698], "differs")

    # a 95 % interval (0.035 +- 0.035) that just misses 0 agrees once widened for 12 cells (z 2.87 vs 1.96) ...
    assert family_agreement([check(0.0002)] * 12) == 12
    # ... and not for one cell alone, nor when the difference is far beyond the interval
    assert family_agreement([check(0.0002)]) == 0
    far = ClosedFormCheck("c", 1.0, "token", 4, 8, 200, [0.9, 0.85, 0.95], 0.7, [0.2, 0.19, 0.21], "differs")
    assert family_agreement([far] * 12) == 0


def test_the_paper_counts_only_checks_that_can_fail_and_prints_the_degrees_of_freedom():
    from types import SimpleNamespace

    from rakv.experiments.prose_sampling import acceptance_sentences, family_agreement, workloads_table

    rng = np.random.default_rng(4)
    token = ss.closed_form_checks(synthetic_runs(rng, requests=8))[0]
    planted = dataclasses.replace(ss.closed_form_checks(greedy_runs(rng))[0], verdict=CheckVerdict.AGREES)
    block = ss.closed_form_checks(block_runs(rng, requests=6))[0]
    sampling = SimpleNamespace(closed_form=[token, planted, block], distribution_checks=ABSENT)
    text = " ".join(acceptance_sentences(sampling))
    judged = [c for c in (token, block) if c.verdict in (CheckVerdict.AGREES, CheckVerdict.DIFFERS)]
    agree = sum(c.verdict == CheckVerdict.AGREES for c in judged)
    assert f"in {agree} of the {len(judged)} checks that can fail" in text
    assert "The 1 greedy cells are not counted" in text and "on 5 to 5 degrees of freedom" in text
    # the identity never enters the simultaneous count either
    assert family_agreement([planted] * 12) == 0
    rows = ss.long_context_rows(long_context_frame(np.random.default_rng(3)))
    table = workloads_table(SimpleNamespace(structured=[], long_context=rows))
    assert "latency / kv-only & df" in table and table.count(" & 2 \\\\") == len(rows)


def test_the_mode_count_test_ranks_a_shifted_count_and_not_a_resample():
    rng = np.random.default_rng(5)
    plain = rng.binomial(6, 0.4, 200)
    assert ss.mode_count_test(plain, rng.binomial(6, 0.55, 200)) < 1e-3
    assert ss.mode_count_test(plain, rng.binomial(6, 0.4, 200)) > 0.01
    assert ss.mode_count_test([2, 2], [2, 2]) == 1.0  # nothing to rank


def first_rounds(rng, gain: float, pairs: int = 200) -> pd.DataFrame:
    """Paired first rounds: the same draft candidates (a shared difficulty per pair) verified by both rules; block
    accepts `gain` more on average."""
    rows = []
    for seed in range(pairs):
        hard = rng.uniform(0.3, 0.9)
        for arm, extra in (("token", 0.0), ("block", gain)):
            accepted = int(min(4, rng.binomial(4, min(1.0, hard + extra))))
            rows.append({"configuration": "c", "temperature": 1.0, "arm": arm, "k": 4, "prompt_id": f"p{seed % 2}",
                         "seed_index": seed, "first_proposed": 4, "first_accepted": accepted,
                         "latency_s": 0.1 + 0.01 * rng.random()})
    return pd.DataFrame(rows)


def given_draft(rng, gain: float, requests: int = 200) -> pd.DataFrame:
    """Both rules' expected accepted count given each request's drafts (a shared difficulty per request); block's
    exceeds token-wise's by `gain` per round on average, either sign on one request."""
    rows = []
    for seed in range(requests):
        for arm in ("token", "block"):
            rounds = int(rng.integers(1, 4))
            token = rng.uniform(0.5, 3.5, rounds)
            block = token + gain + rng.normal(0, 0.3, rounds)
            rows.append({"configuration": "c", "temperature": 1.0, "arm": arm, "k": 4, "prompt_id": f"p{seed % 2}",
                         "seed_index": seed, "rounds": rounds, "expected_token": token.sum(),
                         "expected_block": block.sum(), "latency_s": 0.1 + 0.01 * rng.random()})
    return pd.DataFrame(rows)


def test_block_against_token_given_the_draft_can_say_more_fewer_or_inconclusive():
    rng = np.random.default_rng(5)
    (more,) = ss.block_vs_token_given_draft(given_draft(rng, gain=0.1))
    assert more.verdict == "more" and more.source == ss.EXPECTED_GIVEN_DRAFT and more.requests == 400
    assert more.block_per_round > more.token_per_round
    (fewer,) = ss.block_vs_token_given_draft(given_draft(rng, gain=-0.1))
    assert fewer.verdict == "fewer" and fewer.difference[2] < 0
    (same,) = ss.block_vs_token_given_draft(given_draft(rng, gain=0.0, requests=10))
    assert same.verdict == "inconclusive" and same.difference[1] < 0 < same.difference[2]
    assert ss.block_vs_token_given_draft(given_draft(rng, 0.0).drop(columns="expected_block")) == []


def test_block_against_token_on_paired_first_rounds_can_say_more_or_inconclusive():
    rng = np.random.default_rng(11)
    (more,) = ss.block_vs_token_first_round(first_rounds(rng, gain=0.1))
    assert more.verdict == "more" and more.difference[1] > 0 and more.source == ss.FIRST_ROUNDS
    assert more.requests == 200 and more.block_per_round > more.token_per_round
    (same,) = ss.block_vs_token_first_round(first_rounds(rng, gain=0.0, pairs=20))
    assert same.verdict == "inconclusive" and same.difference[1] < 0 < same.difference[2]
    assert ss.block_vs_token_first_round(first_rounds(rng, 0.0).drop(columns="first_accepted")) == []


def long_context_frame(rng, documents: int = 3) -> pd.DataFrame:
    """Two length bins, two budgets, two questions per document: kv-only at half AR's latency on second questions
    under the large budget (a hit), equal otherwise; rakv-asd at 0.8 of kv-only's everywhere."""
    rows = []
    for length_bin, tokens in (("1024-2048", 1500), ("2048-3072", 2800)):
        for d in range(documents):
            for budget in (512, 160):
                for question in (0, 1):
                    ar = tokens / 400 * rng.uniform(0.95, 1.05)
                    hit = budget == 512 and question == 1
                    kv = ar * (0.5 if hit else 1.0) * rng.uniform(0.97, 1.03)
                    for strategy, latency in (("ar", ar), ("kv-only", kv), ("rakv-asd", 0.8 * kv)):
                        rows.append({"configuration": "c", "budget_mib": budget, "document": f"{length_bin}/{d}",
                                     "length_bin": length_bin, "question": question, "strategy": strategy,
                                     "document_tokens": tokens, "hit_tokens": tokens if hit and strategy != "ar" else 0,
                                     "evictions": int(budget == 160 and question == 1), "ttft_s": latency / 2,
                                     "latency_s": latency,
                                     "measured_under_mib": 512 if strategy == "ar" else budget})
    return pd.DataFrame(rows)


def test_long_context_rows_are_per_length_bin_with_reuse_and_speculation_on_top():
    rows = ss.long_context_rows(long_context_frame(np.random.default_rng(3)))
    assert len(rows) == 2 * 2 * 3 and {r.documents for r in rows} == {3}
    by = {(r.budget_mib, r.length_bin, r.strategy): r for r in rows}
    reuse = by[512.0, "2048-3072", "kv-only"]
    # a hit on one of two questions: the geometric mean of 0.5 and 1.0 per document
    assert abs(reuse.vs_ar[0] - math.sqrt(0.5)) < 0.03 and reuse.vs_ar[2] < 1.0
    assert by[160.0, "1024-2048", "kv-only"].vs_ar[1] < 1.0 < by[160.0, "1024-2048", "kv-only"].vs_ar[2]
    on_top = by[512.0, "1024-2048", "rakv-asd"].vs_reuse
    assert on_top[0] == pytest.approx(0.8) and on_top[2] < 1.0
    assert math.isnan(reuse.vs_reuse[0])
    # evictions summed over the requests measured under the row's budget; AR's copied rows say none
    assert by[160.0, "1024-2048", "kv-only"].evictions == 3 and by[512.0, "1024-2048", "kv-only"].evictions == 0
    assert by[512.0, "1024-2048", "ar"].evictions == 0 and by[160.0, "1024-2048", "ar"].evictions is None
    # t intervals over three documents: 2 degrees of freedom, recorded beside each ratio; one document, none
    assert {r.vs_ar_degrees_of_freedom for r in rows} == {2}
    assert on_top is by[512.0, "1024-2048", "rakv-asd"].vs_reuse and reuse.vs_reuse_degrees_of_freedom is None
    assert by[512.0, "1024-2048", "rakv-asd"].vs_reuse_degrees_of_freedom == 2
    single = ss.long_context_rows(long_context_frame(np.random.default_rng(3), documents=1))
    assert {r.vs_ar_degrees_of_freedom for r in single} == {None} and math.isnan(single[0].vs_ar[1])


def test_long_context_strategies_take_turns_at_running_first():
    from rakv.experiments.sampling import rotated

    orders = [rotated(["ar", "kv-only", "rakv-asd"], turn) for turn in range(6)]
    assert [o[0] for o in orders] == ["ar", "kv-only", "rakv-asd"] * 2
    assert all(sorted(o) == ["ar", "kv-only", "rakv-asd"] for o in orders)
