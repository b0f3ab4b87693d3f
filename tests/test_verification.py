"""The verification rules by exact enumeration on a toy vocabulary (rakv.runtime.verification).

A toy target and draft give each context its own next-token distribution (some with zero-probability tokens, as
top-p makes them). Enumerating every draft block and every outcome of a round, with the rules' own probabilities
(the block rule's stop probabilities, weights and residuals are the functions its sampler draws from), gives the
exact distribution of the first tokens a speculative decoder emits; it must equal the target's own. The positive
control, greedy acceptance at temperature 1, must not: the enumeration would see a biased rule.
"""

from collections import defaultdict
from functools import cache
from itertools import product

import pytest
import torch
from scipy.stats import binomtest

from rakv.runtime.verification import (
    accept_tokenwise,
    block_residual,
    block_stop_probabilities,
    block_weights,
    closed_form_acceptance,
    expected_accepted,
    proposal_rows,
)

VOCAB = 3


@cache
def toy_distribution(seed: int, context: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + sum((t + 1) * 7 ** i for i, t in enumerate(context)))
    probs = (torch.randn(VOCAB, generator=generator, dtype=torch.float64) * 1.5).softmax(-1)
    if len(context) % 2 and seed == 1:  # the target drops its least likely token here, as top-p would
        probs[probs.argmin()] = 0.0
        probs = probs / probs.sum()
    return probs


def target(context):
    return toy_distribution(1, context)


def draft(context):
    return toy_distribution(2, context)


def normalised(residual: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = residual.sum()
    return residual / total if total > 0 else fallback


def rows(context, block):
    p = torch.stack([target(context + block[:j]) for j in range(len(block) + 1)])
    q = torch.stack([draft(context + block[:j]) for j in range(len(block))])
    return p, q


def tokenwise_outcomes(p, q, block):
    """P(tau = i) = prod_{j<i} a_j (1 - a_i), a_j = min(1, p_j(c_j) / q_j(c_j)); the next token from the residual."""
    out, reach = [], 1.0
    for i, x in enumerate(block):
        a = min(1.0, float(p[i, x] / q[i, x])) if q[i, x] > 0 else 1.0
        out.append((i, reach * (1 - a), normalised((p[i] - q[i]).clamp_min(0), p[i])))
        reach *= a
    out.append((len(block), reach, p[len(block)]))
    return out


def block_outcomes(p, q, block):
    """P(tau = i) = h_i prod_{j>i} (1 - h_j): the rule's own stop probabilities and residuals."""
    block = list(block)
    stops, weights = block_stop_probabilities(block, q, p), block_weights(block, q, p)
    n, out = len(block), []
    for i in range(n + 1):
        passes = stops[i] if i else 1.0
        for j in range(i + 1, n + 1):
            passes *= 1 - stops[j]
        nxt = p[n] if i == n else normalised(block_residual(weights[i], p[i], q[i]), p[i])
        out.append((i, passes, nxt))
    return out


def greedy_at_temperature_outcomes(p, q, block):
    """The positive control: a candidate passes iff it is the target's argmax; then a token sampled from p."""
    for i, x in enumerate(block):
        if x != int(p[i].argmax()):
            return [(i, 1.0, p[i])]
    return [(len(block), 1.0, p[len(block)])]


def round_outcomes(rule, context, block):
    p, q = rows(context, block)
    result = defaultdict(float)
    for kept, prob, nxt in rule(p, q, block):
        for token in range(VOCAB):
            if prob * nxt[token] > 0:
                result[block[:kept] + (token,)] += prob * float(nxt[token])
    return result


def blocks(context, gamma, point_mass):
    """Every draft block with its probability; a point-mass proposer (prompt lookup) offers one block."""
    if point_mass:
        block = ()
        for _ in range(gamma):
            block += (int(draft(context + block).argmax()),)
        yield block, 1.0
        return
    for block in product(range(VOCAB), repeat=gamma):
        prob = 1.0
        for j, x in enumerate(block):
            prob *= float(draft(context + block[:j])[x])
        if prob > 0:
            yield block, prob


def point_mass_rows(context, block):
    p, _ = rows(context, block)
    return p, proposal_rows(list(block), None, p)


def emitted(rule, length, gamma, point_mass=False):
    """The exact distribution of the first `length` tokens emitted by rounds of `gamma` candidates."""

    def go(context, need):
        if need == 0:
            return {(): 1.0}
        out = defaultdict(float)
        for block, q_block in blocks(context, gamma, point_mass):
            if point_mass:
                p, q = point_mass_rows(context, block)
                outcomes = defaultdict(float)
                for kept, prob, nxt in rule(p, q, block):
                    for token in range(VOCAB):
                        outcomes[block[:kept] + (token,)] += prob * float(nxt[token])
            else:
                outcomes = round_outcomes(rule, context, block)
            for tokens, prob in outcomes.items():
                if prob == 0:
                    continue
                if len(tokens) >= need:
                    out[tokens[:need]] += q_block * prob
                else:
                    for rest, p_rest in go(context + tokens, need - len(tokens)).items():
                        out[tokens + rest] += q_block * prob * p_rest
        return out

    return go((), length)


def target_sequences(length):
    out = {}
    for seq in product(range(VOCAB), repeat=length):
        prob = 1.0
        for j, x in enumerate(seq):
            prob *= float(target(seq[:j])[x])
        if prob > 0:
            out[seq] = prob
    return out


def total_variation(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("point_mass", [False, True], ids=["draft", "point-mass"])
@pytest.mark.parametrize("rule", [tokenwise_outcomes, block_outcomes], ids=["token", "block"])
def test_a_rule_emits_exactly_the_targets_distribution(rule, point_mass, gamma):
    # three candidates enumerated over four tokens take minutes; over three they still cover every rejection point
    # of a full block (the bonus token is covered by one and two candidates)
    length = 4 if gamma < 3 else 3
    assert total_variation(emitted(rule, length, gamma, point_mass), target_sequences(length)) < 1e-12


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft", "point-mass"])
def test_the_positive_control_is_seen_as_biased(point_mass):
    assert total_variation(emitted(greedy_at_temperature_outcomes, 4, 2, point_mass), target_sequences(4)) > 0.05


def expected_kept(rule, gamma):
    return sum(q_block * prob * kept
               for block, q_block in blocks((), gamma, False)
               for kept, prob, _ in rule(*rows((), block), block))


@pytest.mark.parametrize("gamma", [2, 3, 4])
def test_block_keeps_at_least_as_many_candidates_as_tokenwise(gamma):
    assert expected_kept(block_outcomes, gamma) >= expected_kept(tokenwise_outcomes, gamma) - 1e-12


@pytest.mark.parametrize("gamma", [2, 3])
def test_expected_accepted_given_the_draft_averages_to_each_rules_expectation(gamma):
    """expected_accepted's two values on a draft, averaged over every draft with its probability, are the expected
    kept candidates of the enumerated rounds: the conditional expectation the analysis compares the rules with."""
    given = [0.0, 0.0]
    for block, q_block in blocks((), gamma, False):
        p, q = rows((), block)
        token, block_kept = expected_accepted(list(block), q, p)
        given[0] += q_block * token
        given[1] += q_block * block_kept
    assert given[0] == pytest.approx(expected_kept(tokenwise_outcomes, gamma), abs=1e-9)
    assert given[1] == pytest.approx(expected_kept(block_outcomes, gamma), abs=1e-9)


def test_the_papers_two_token_example():
    """Sun et al.'s example: context-free p = (1/3, 2/3), q = (2/3, 1/3), two candidates: token-wise keeps 10/9
    candidates per round in expectation, block verification 11/9."""
    p_row, q_row = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64), torch.tensor([2 / 3, 1 / 3], dtype=torch.float64)
    p, q = p_row.repeat(3, 1), q_row.repeat(2, 1)
    kept = {rule: sum(float(q_row[a] * q_row[b]) * prob * n
                      for a, b in product(range(2), repeat=2) for n, prob, _ in rule(p, q, (a, b)))
            for rule in (tokenwise_outcomes, block_outcomes)}
    assert kept[tokenwise_outcomes] == pytest.approx(10 / 9) and kept[block_outcomes] == pytest.approx(11 / 9)
    # on one draft block may keep fewer: (0, 0) keeps 0.75 token-wise in expectation, 0.5 under block
    assert expected_accepted([0, 0], q, p) == pytest.approx((0.75, 0.5))


def test_measured_tokenwise_acceptance_matches_its_closed_form():
    """A candidate drawn from q passes the token-wise rule with probability sum_x min(p(x), q(x)): 4,000 seeded
    draws inside the binomial test's acceptance region at 1e-3, and a wrong closed form (the greedy match rate)
    outside it."""
    p = target((0,)).float().repeat(2, 1)
    q = draft((0,)).float().repeat(1, 1)
    generator, passed, draws = torch.Generator().manual_seed(7), 0, 4000
    for _ in range(draws):
        x = int(torch.multinomial(q[0], 1, generator=generator))
        passed += len(accept_tokenwise([x], q, p, generator)) == 2
    alpha = float(closed_form_acceptance(p, q)[0])
    assert binomtest(passed, draws, alpha).pvalue > 1e-3
    greedy_rate = float(q[0, p[0].argmax()])
    assert binomtest(passed, draws, greedy_rate).pvalue < 1e-3
