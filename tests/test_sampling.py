"""Both sampled verification rules preserve the target distribution (chi-square, fixed seed, many draws; the exact
version by enumeration: tests/test_verification.py)."""

import pytest
import torch
from scipy.stats import chisquare

from rakv.runtime.decoding import Sampling, accept_round, probabilities

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
