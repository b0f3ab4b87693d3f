"""Both sampled verification rules preserve the target distribution (chi-square, fixed seed, many draws; the exact
version by enumeration: tests/test_verification.py)."""

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import chisquare

from rakv.runtime.decoding import Sampling, accept_round, probabilities
from rakv.runtime.verification import closed_form_moments

SAMPLING = Sampling(temperature=1.0, top_p=1.0, seed=0)
TARGET_LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
DRAFT_LOGITS = torch.tensor([-1.0, 0.0, 2.0, 1.0, 0.5])  # a draft that disagrees badly


def first_tokens(draws, proposal_for, verify="token"):
    generator = torch.Generator().manual_seed(1234)
    logits = TARGET_LOGITS.repeat(3, 1)  # k = 2 candidates + bonus position
    sampling = Sampling(temperature=1.0, top_p=1.0, seed=0, verify=verify)
    counts = torch.zeros(5)
    for _ in range(draws):
        candidates, proposal = proposal_for(generator)
        counts[accept_round(candidates, proposal, logits, sampling, generator).tokens[0]] += 1
    return counts


@pytest.mark.parametrize("verify", ["token", "block"])
def test_rejection_sampling_with_a_draft_distribution_matches_target(verify):
    q = probabilities(DRAFT_LOGITS, SAMPLING)

    def propose(generator):
        tokens = torch.multinomial(q, 2, replacement=True, generator=generator).tolist()
        return tokens, q.repeat(2, 1)

    counts = first_tokens(20000, propose, verify)
    p = probabilities(TARGET_LOGITS, SAMPLING)
    assert chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue > 0.01
    # and a sampler that compared tokens for equality instead would be far off: sanity of the test's power
    assert chisquare(counts.numpy(), (q * counts.sum()).numpy()).pvalue < 1e-6


@pytest.mark.parametrize("verify", ["token", "block"])
def test_rejection_sampling_with_deterministic_candidates_matches_target(verify):
    counts = first_tokens(20000, lambda generator: ([3, 3], None), verify)  # a point mass on a low-p token
    p = probabilities(TARGET_LOGITS, SAMPLING)
    assert chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue > 0.01


def test_top_p_keeps_the_nucleus_and_renormalises():
    probs = probabilities(torch.tensor([3.0, 2.0, 1.0, -5.0]), Sampling(temperature=1.0, top_p=0.7))
    full = torch.tensor([3.0, 2.0, 1.0, -5.0]).softmax(-1)
    assert probs[3] == 0 and probs[2] == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))
    assert torch.allclose(probs[:2], full[:2] / full[:2].sum())


def verified_requests(verify: str, label: str, requests: int = 250, rounds: int = 8, seed: int = 1000) -> pd.DataFrame:
    """Rounds of three candidates drawn from a draft that disagrees mildly with the target, verified by `verify`,
    logged per request as the engine logs them (accepted, rejections, the closed form's moments, both rules'
    expected accepted count given each draft) under the rule name `label`. One fixed seed: a 95 % check that
    holds fails at 5 % of seeds (its coverage is simulated in tests/test_sampling_stats.py; 20 of 20 seeds from
    1000 agreed here, while seed 7 was one of the 5 %)."""
    generator = torch.Generator().manual_seed(seed)
    q = probabilities(torch.tensor([1.0, 2.0, 0.5, 0.0, -1.0]), SAMPLING)
    logits = TARGET_LOGITS.repeat(4, 1)
    sampling = Sampling(temperature=1.0, top_p=1.0, seed=0, verify=verify)
    rows = []
    for r in range(requests):
        log, alphas, expected = [], [], np.zeros(2)
        for _ in range(rounds):
            candidates = torch.multinomial(q, 3, replacement=True, generator=generator).tolist()
            verdict = accept_round(candidates, q.repeat(3, 1), logits, sampling, generator)
            log.append((3, verdict.accepted))
            alphas.append(verdict.closed_form)
            expected += verdict.expected
        closed, variance = closed_form_moments(log, alphas)
        rows.append({"configuration": "c", "temperature": 1.0, "verify": label, "k": 3, "strategy": "spec-k3",
                     "accepted": sum(a for _, a in log), "rejections": sum(a < 3 for _, a in log),
                     "closed_form_accepted": closed, "closed_form_variance": variance,
                     "expected_accepted_token": expected[0], "expected_accepted_block": expected[1],
                     "prompt_id": f"p{r % 4}", "seed_index": r // 4})
    return pd.DataFrame(rows)


def test_each_rule_agrees_with_its_own_expectation_and_not_with_the_other_rules():
    """The sampling stage's acceptance checks (rakv.experiments.sampling_stats.closed_form_checks) on the rules
    themselves: block verification agrees with its expectation given the drafts and is told from token-wise's
    (on these drafts block keeps 1.51 candidates a round against 1.33, by exact enumeration); a token-wise verifier
    passed off as block fails the block check."""
    from rakv.experiments.sampling_stats import closed_form_checks
    from rakv.experiments.verdicts import CheckVerdict

    (block,) = closed_form_checks(verified_requests("block", "block"))
    assert block.verdict == CheckVerdict.AGREES and block.versus_token[1] > 0
    (token,) = closed_form_checks(verified_requests("token", "token"))
    assert token.verdict == CheckVerdict.AGREES
    (impostor,) = closed_form_checks(verified_requests("token", "block"))
    assert impostor.verdict == CheckVerdict.DIFFERS and impostor.difference[2] < 0
