"""The verification rules of a speculative round and the closed form of their acceptance (paper/main.tex, Method:
"Speculative decoding"; docs/sampling.md).

A round verifies candidates c_0 .. c_{n-1} with one target forward, whose rows give the target's distributions
p_0 .. p_n (p_j is the distribution of the round's j-th new token; p_n is the bonus position). A proposer that
samples its candidates gives its proposal distributions q_0 .. q_{n-1}; a deterministic one (prompt lookup, or
any proposer under greedy decoding) is a point mass on each candidate. The rules:

- **greedy**: the longest prefix of candidates equal to the target's argmax, then the target's own token;
- **token-wise** (Leviathan et al., 2023; Chen et al., 2023): c_j is accepted with probability
  min(1, p_j(c_j) / q_j(c_j)); at the first rejection a token is drawn from normalise(max(0, p_j - q_j)); when all
  pass, a bonus token from p_n. Given the round reached position j, c_j ~ q_j is accepted with probability
  alpha_j = sum_x min(p_j(x), q_j(x)) (p_j(c_j) for a point mass): the closed form the study checks its measured
  acceptance against;
- **block** (Sun et al., 2025, "Block Verification Accelerates Speculative Decoding", Algorithm 2): the block is
  judged jointly. With w_0 = 1 and w_i = min(1, w_{i-1} p_{i-1}(c_{i-1}) / q_{i-1}(c_{i-1})), the residual mass
  r_i = sum_x max(0, w_i p_i(x) - q_i(x)) and h_i = r_i / (r_i + 1 - w_i) for i < n, h_n = w_n, the round keeps
  the longest prefix of length tau = max{i >= 1 : eta_i <= h_i} (0 if none; eta_i uniform), then draws its next
  token from p_n when tau = n, else from normalise(max(0, w_tau p_tau - q_tau)). It preserves the target's
  distribution and accepts at least as many candidates as token-wise in expectation
  (tests/test_verification.py checks both by exact enumeration on a toy vocabulary).

Every rule returns a `Verdict`: the confirmed tokens and, per verified candidate, alpha_j; a sampled round also gives
both rules' expected accepted count given its draft (`expected_accepted`), whichever rule ran.

One more rule exists only as the positive control of the distribution tests (rakv.experiments.sampling): **biased**
accepts a candidate exactly when it is the target's most likely token, at any temperature, and otherwise draws from
p_j. It over-weights the argmax (it emits it with probability q(a) + (1 - q(a)) p(a), not p(a)), so a test that
cannot tell it from the target's distribution has no power. Never a serving option.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

VERIFY_RULES = ("token", "block")
CONTROL_RULES = ("biased",)  # deliberately not distribution-preserving: the tests' positive control


def probabilities(logits: torch.Tensor, sampling) -> torch.Tensor:
    """Temperature then nucleus (top-p) filtering, as transformers' warpers do; rows sum to 1."""
    scaled = logits / sampling.temperature
    if sampling.top_p < 1.0:
        sorted_logits, order = scaled.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= sampling.top_p  # keeps the token crossing p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
    return scaled.softmax(-1)


@dataclass(frozen=True)
class Verdict:
    """What a round's verification confirms: the accepted candidates then one token of the target's (correction or
    bonus), and for each verified candidate the token-wise rule's acceptance probability given the round reached it
    (alpha_j = sum_x min(p_j(x), q_j(x)); under greedy decoding 1.0 when the candidate is the target's argmax, else
    0.0)."""

    tokens: list[int]
    closed_form: tuple[float, ...]
    # sampled rounds with candidates: (token-wise, block) expected accepted candidates given this round's draft
    expected: tuple[float, float] = ()

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1


def proposal_rows(candidates: list[int], proposal: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """q_0 .. q_{n-1} [n, vocab]: the proposer's distributions, or point masses on the candidates when it gave
    none (a deterministic proposer)."""
    if proposal is not None:
        return proposal[:len(candidates)].to(like.dtype)
    q = torch.zeros((len(candidates), like.shape[-1]), dtype=like.dtype, device=like.device)
    if candidates:
        q[torch.arange(len(candidates)), torch.tensor(candidates, device=like.device)] = 1.0
    return q


def closed_form_acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """alpha_j = sum_x min(p_j(x), q_j(x)) for each of q's rows: the probability that c_j ~ q_j passes the
    token-wise rule (1 - the total variation distance between p_j and q_j)."""
    return torch.minimum(p[:q.shape[0]], q).sum(-1)


def accept_greedy(candidates: list[int], logits: torch.Tensor) -> Verdict:
    """Longest agreeing prefix of the candidates, then the target's own token (correction or bonus)."""
    target = logits.argmax(-1).tolist()
    n = 0
    while n < len(candidates) and candidates[n] == target[n]:
        n += 1
    return Verdict(candidates[:n] + [target[n]],
                   tuple(float(c == t) for c, t in zip(candidates, target, strict=False)))


def _draw(dist: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(dist, 1, generator=generator))


def accept_tokenwise(candidates: list[int], q: torch.Tensor, p: torch.Tensor,
                     generator: torch.Generator | None) -> list[int]:
    """Modified rejection sampling: accept c_j with probability min(1, p_j(c_j) / q_j(c_j)); at the first rejection
    draw from normalise(max(0, p_j - q_j)); if all pass, a bonus token from p_n."""
    out = []
    for i, x in enumerate(candidates):
        u = torch.rand((), generator=generator, device=p.device)
        if u * q[i, x] < p[i, x]:  # u < p/q without dividing by a possibly zero q
            out.append(x)
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        total = residual.sum()
        out.append(_draw(residual / total if total > 0 else p[i], generator))
        return out
    out.append(_draw(p[len(candidates)], generator))
    return out


def accept_biased(candidates: list[int], p: torch.Tensor, generator: torch.Generator | None) -> list[int]:
    """The positive control: keep c_j while it is argmax p_j; at the first other candidate draw from p_j (not the
    residual), after all a bonus from p_n. Biased towards the argmax whenever q puts mass on it."""
    target = p.argmax(-1).tolist()
    for i, x in enumerate(candidates):
        if x != target[i]:
            return candidates[:i] + [_draw(p[i], generator)]
    return candidates + [_draw(p[len(candidates)], generator)]


def closed_form_moments(round_log: list[tuple[int, int]],
                        closed_form_log: list[tuple[float, ...]]) -> tuple[float, float]:
    """Sums over the positions the rounds reached (the accepted ones and the one rejected) of alpha_j and of
    alpha_j (1 - alpha_j). Under the token-wise rule each reached position passes with probability alpha_j given
    everything before it, so the accepted count minus the first sum has mean zero and, by the martingale's
    predictable variation, the second sum as its variance: what the measured acceptance is checked against."""
    mean = variance = 0.0
    for (verified, accepted), alphas in zip(round_log, closed_form_log, strict=True):
        reached = alphas[:accepted + (accepted < verified)]
        mean += sum(reached)
        variance += sum(a * (1.0 - a) for a in reached)
    return mean, variance


def block_weights(candidates: list[int], q: torch.Tensor, p: torch.Tensor) -> list[float]:
    """w_0 .. w_n: w_0 = 1, w_i = min(1, w_{i-1} p_{i-1}(c_{i-1}) / q_{i-1}(c_{i-1}))."""
    weights = [1.0]
    for i, x in enumerate(candidates):
        ratio = float(p[i, x]) / float(q[i, x]) if float(q[i, x]) > 0 else float("inf")
        weights.append(min(1.0, weights[-1] * ratio) if weights[-1] > 0 else 0.0)
    return weights


def block_residual(weight: float, p_row: torch.Tensor, q_row: torch.Tensor) -> torch.Tensor:
    """max(0, w p - q), not normalised: the distribution (up to its mass) the block rule draws from when it stops."""
    return (weight * p_row - q_row).clamp_min(0)


def block_stop_probabilities(candidates: list[int], q: torch.Tensor, p: torch.Tensor) -> list[float]:
    """h_1 .. h_n as a list indexed 0 .. n (h_0 unused, 0.0): the probability that the block rule may end at i."""
    n = len(candidates)
    weights = block_weights(candidates, q, p)
    stops = [0.0]
    for i in range(1, n):
        residual = float(block_residual(weights[i], p[i], q[i]).sum())
        denominator = residual + 1.0 - weights[i]
        # a zero denominator means w_i = 1 and p_i = q_i: nothing to draw from at i, so the rule must not end there
        stops.append(residual / denominator if denominator > 0 else 0.0)
    if n:
        stops.append(weights[n])
    return stops


def expected_accepted(candidates: list[int], q: torch.Tensor, p: torch.Tensor,
                      stops: list[float] | None = None) -> tuple[float, float]:
    """Given the round's draft, how many candidates each rule accepts in expectation: token-wise
    sum_{i=1..n} prod_{j<i} min(1, p_j(c_j) / q_j(c_j)), block sum_i i h_i prod_{j>i} (1 - h_j). Conditioning on the
    draft takes the rules' own coin flips out of the comparison (Rao-Blackwell): both are judged on the same drafts,
    with far less noise than their accepted counts, and averaged over drafts from q each is its rule's expected
    acceptance per round. Block may keep fewer than token-wise on one draft (Sun et al.'s example: p = (1/3, 2/3),
    q = (2/3, 1/3), draft (0, 0): 0.5 against 0.75); only over drafts does it keep at least as many."""
    token, reach = 0.0, 1.0
    for i, x in enumerate(candidates):
        reach *= min(1.0, float(p[i, x]) / float(q[i, x])) if float(q[i, x]) > 0 else 1.0
        token += reach
    stops = block_stop_probabilities(candidates, q, p) if stops is None else stops
    block, survive = 0.0, 1.0
    for i in range(len(candidates), 0, -1):  # P(tau = i) = h_i prod_{j>i} (1 - h_j)
        block += i * stops[i] * survive
        survive *= 1.0 - stops[i]
    return token, block


def accept_block(candidates: list[int], q: torch.Tensor, p: torch.Tensor,
                 generator: torch.Generator | None, stops: list[float] | None = None) -> list[int]:
    """Block verification: the longest i whose eta_i <= h_i keeps c_0 .. c_{i-1}; then a token from p_n (all kept)
    or from normalise(max(0, w_i p_i - q_i)). Drawing eta_n, eta_{n-1}, ... and stopping at the first pass picks
    the same i with the same probability as drawing all of them."""
    n = len(candidates)
    stops = block_stop_probabilities(candidates, q, p) if stops is None else stops
    kept = 0
    for i in range(n, 0, -1):
        if float(torch.rand((), generator=generator, device=p.device)) <= stops[i]:
            kept = i
            break
    if kept == n:
        return candidates + [_draw(p[n], generator)]
    residual = block_residual(block_weights(candidates, q, p)[kept], p[kept], q[kept])
    total = residual.sum()
    return candidates[:kept] + [_draw(residual / total if total > 0 else p[kept], generator)]


def verify(candidates: list[int], proposal: torch.Tensor | None, logits: torch.Tensor, sampling,
           generator: torch.Generator | None) -> Verdict:
    """The round's verdict under `sampling` (rakv.runtime.decoding.Sampling): greedy, or its `verify` rule."""
    if sampling.greedy:
        return accept_greedy(candidates, logits)
    p = probabilities(logits, sampling)
    q = proposal_rows(candidates, proposal, p)
    stops = block_stop_probabilities(candidates, q, p) if candidates else []
    if sampling.verify == "biased":
        tokens = accept_biased(candidates, p, generator)
    elif sampling.verify == "block":
        tokens = accept_block(candidates, q, p, generator, stops)
    else:
        tokens = accept_tokenwise(candidates, q, p, generator)
    if not candidates:
        return Verdict(tokens, ())
    return Verdict(tokens, tuple(closed_form_acceptance(p, q).tolist()), expected_accepted(candidates, q, p, stops))
