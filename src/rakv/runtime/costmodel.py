"""The cost model C(r, k) (paper/main.tex, Method: "Cost model and controller"), as pure functions.

A `CostTable` holds the measured costs of the operations the decode loops perform (rakv.runtime.calibration
measures and stores them); `estimate_latency` is a pure function of (cost table, request features,
alpha), so the controller, the sensitivity analysis and the notebooks all call the same code.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class Curve:
    """A measured cost against one variable: a polynomial (`kind="poly"`, coefficients given) or a per-point table
    with linear interpolation between the measured points and extrapolation along the end segments
    (`kind="table"`, what calibration measures), with its fit quality and the repeat spread of each point."""

    coefficients: list[float]  # poly: highest power first (numpy.polyval order); table: unused
    r2: float
    max_rel_error: float  # poly: largest |fit - point| / point; table: largest monotone adjustment of a point
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)  # measured medians (table: after the monotone adjustment)
    kind: str = "poly"
    spread: list[float] = field(default_factory=list)  # per point: median absolute deviation / median of the repeats
    samples: list[int] = field(default_factory=list)  # per point: repeats behind the median

    def __call__(self, x: float) -> float:
        if self.kind == "table":
            return max(_interpolate(self.xs, self.ys, x), 0.0)
        value = 0.0
        for c in self.coefficients:  # Horner in plain Python: on scalars, no array set-up per call as np.polyval has
            value = value * x + c
        return max(value, 0.0)

    @classmethod
    def table(cls, xs, medians, spread=(), samples=(), monotone: bool = True) -> Curve:
        """Interpolate the measured medians; `monotone`: a cost that cannot fall as x grows is made
        non-decreasing by pooling adjacent violators (the adjustment is kept as max_rel_error)."""
        order = np.argsort(np.asarray(xs, float))
        xs = np.asarray(xs, float)[order]
        medians = np.asarray(medians, float)[order]
        ys = non_decreasing(medians) if monotone else medians
        adjustment = float((np.abs(ys - medians) / np.maximum(medians, 1e-12)).max()) if len(ys) else 0.0
        return cls([], 1.0, adjustment, xs.tolist(), ys.tolist(), "table",
                   [float(v) for v in np.asarray(spread, float)[order]] if len(spread) else [],
                   [int(v) for v in np.asarray(samples)[order]] if len(samples) else [])


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise linear through (xs, ys); beyond the ends, the end segments extended."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect.bisect_right(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def non_decreasing(values) -> np.ndarray:
    """The least-squares non-decreasing sequence (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight]
    for v in np.asarray(values, float):
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1), (m2, w2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2]
    return np.concatenate([[m] * int(w) for m, w in blocks]) if blocks else np.asarray([], float)


@dataclass
class CostTable:
    key: dict
    target_prefill: Curve  # seconds vs tokens computed
    target_step: Curve  # seconds of one target token vs context length
    verify: dict[int, Curve]  # seconds of one target forward over k+1 tokens vs context length
    propose: dict[int, Curve]  # seconds for the proposer's k candidates vs context length
    proposer_prefill: Curve  # seconds vs context length (0 for a model-free proposer)
    kv_copy: Curve  # seconds to copy reused K/V out of the store vs tokens reused
    target_kv_bytes_per_token: float
    proposer_kv_bytes_per_token: float
    acceptance: float  # per-token acceptance of the proposer, greedy, on the calibration prompts
    acceptance_rounds: int
    measured_s: float = 0.0
    load_average: list[float] = field(default_factory=list)  # the machine's 1-minute load before and after
    match_rate: float = 1.0  # share of speculative rounds with candidates on the calibration prompts

    def to_json(self) -> dict:
        row = asdict(self)
        row["verify"] = {str(k): v for k, v in row["verify"].items()}
        row["propose"] = {str(k): v for k, v in row["propose"].items()}
        return row

    @classmethod
    def from_json(cls, row: dict) -> CostTable:
        row = dict(row)
        for name in ("target_prefill", "target_step", "proposer_prefill", "kv_copy"):
            row[name] = Curve(**row[name])
        for name in ("verify", "propose"):
            row[name] = {int(k): Curve(**v) for k, v in row[name].items()}
        return cls(**row)


def read_cost_table(path) -> CostTable:
    """A cost table's JSON file: a calibration, or a results folder's copy of one
    (rakv.runtime.run_layout.RunLayout.calibration), the one way such a file is read."""
    import json
    from pathlib import Path

    return CostTable.from_json(json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class RequestFeatures:
    prompt_tokens: int
    hit_tokens: int  # reusable positions if the store is used (0 on a miss)
    new_tokens: int
    exact_hit: bool = False
    draft_hit_tokens: int = 0  # positions of the draft's K/V the store also holds (reused with r = 1, k > 0)

    @classmethod
    def from_hit(cls, prompt_tokens: int, hit, new_tokens: int) -> RequestFeatures:
        """The features of a request that the store would offer `hit` (a rakv.runtime.cache.Hit)."""
        return cls(prompt_tokens, hit.reused_tokens, new_tokens, hit.exact, hit.draft_tokens)


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E_k(alpha) = (1 - alpha^(k+1)) / (1 - alpha): confirmed tokens per round (accepted + 1)."""
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_tokens_by_position(alphas: list[float], k: int) -> float:
    """Confirmed tokens per round of depth k when candidate i is accepted with probability alphas[i - 1] once the
    ones before it were (a proposer whose acceptance falls with the position, the heads: docs/heads.md):
    1 + sum_i prod_{j <= i} alphas[j - 1]; positions past the list's end take its last value. Equal alphas give
    E_k(alpha)."""
    if k == 0:
        return 1.0
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= min(max(alphas[min(i, len(alphas) - 1)], 0.0), 1.0)
        total += reach
    return total


def tokens_per_round(alpha: float, k: int, match: float = 1.0) -> float:
    """Confirmed tokens per round of depth k: m E_k(alpha) + (1 - m), `match` m the share of rounds in which the
    proposer offers candidates (prompt lookup finds no n-gram in the others, which confirm one token); 1 at k = 0.
    The one form of this sum for the cost model, the serving policies, admission, the serving statistics and
    scripts/tune_vllm.py."""
    return match * expected_tokens_per_round(alpha, k) + (1 - match) if k else 1.0


def action_kv_bytes(table: CostTable, features: RequestFeatures, k: int) -> float:
    """K/V bytes an action holds at its peak: the target's whole sequence, plus the proposer's when k > 0."""
    length = features.prompt_tokens + features.new_tokens
    draft = table.proposer_kv_bytes_per_token * (length + k) if k else 0.0
    return table.target_kv_bytes_per_token * length + draft


def estimate_latency(table: CostTable, features: RequestFeatures, reuse: bool, k: int, alpha: float,
                     memory_penalty_s_per_byte: float = 0.0, match_rate: float = 1.0,
                     position_alphas: list[float] | None = None) -> float:
    """C(r, k): prefill of the non-reused part (+ the proposer's prefill of its own non-reused part when k > 0:
    with r = 1 the draft's K/V for `draft_hit_tokens` positions comes from the store, copied at the target's
    per-position copy cost scaled by the draft's K/V bytes) + copy cost when r = 1
    + decode (N - 1 target steps for k = 0; for k > 0, rounds of propose + verify until N - 1 tokens)
    + lambda * bytes. The first token comes from the prefill logits, hence N - 1.

    `match_rate` m: the share of rounds in which the proposer offers candidates (prompt lookup finds no
    match in the others, which then cost a propose attempt and a one-token verify and confirm one token).
    A round then confirms m * E_k(alpha) + (1 - m) tokens on average; m = 1 is the plain model.

    `position_alphas`: acceptance per candidate position (expected_tokens_by_position) in place of the one alpha,
    for a proposer whose acceptance falls with the position (the heads); None: the one alpha (every other
    proposer)."""
    hit = features.hit_tokens if reuse else 0
    exact = reuse and features.exact_hit
    computed = 0 if exact else features.prompt_tokens - hit
    cost = table.target_prefill(computed) if computed else 0.0
    if reuse and hit:
        cost += table.kv_copy(hit)
    steps = max(features.new_tokens - 1, 0)
    mid_context = features.prompt_tokens + features.new_tokens / 2
    if k == 0:
        cost += steps * table.target_step(mid_context)
    else:
        draft_hit = features.draft_hit_tokens if reuse else 0
        cost += table.proposer_prefill(features.prompt_tokens + 1 - draft_hit)
        if draft_hit:
            cost += table.kv_copy(draft_hit) * table.proposer_kv_bytes_per_token / table.target_kv_bytes_per_token
        m = min(max(match_rate, 0.0), 1.0)
        tokens = (tokens_per_round(alpha, k, m) if not position_alphas
                  else m * expected_tokens_by_position(position_alphas, k) + (1 - m))
        per_round = (table.propose[k](mid_context) + m * table.verify[k](mid_context)
                     + (1 - m) * table.target_step(mid_context))
        cost += steps / tokens * per_round
    return cost + memory_penalty_s_per_byte * action_kv_bytes(table, features, k)


# A median of n repeats has a standard error of about 1.2533 sigma / sqrt(n) (normal repeats), and sigma is about
# 1.4826 median absolute deviations: a point's relative standard error from its recorded spread (MAD / median).
MEDIAN_SE_PER_MAD = 1.2533 * 1.4826
TIE_Z = 1.96  # two estimates closer than this many standard errors of their difference are a tie


def prediction_noise(table: CostTable) -> float:
    """The relative standard error of a calibrated cost: the median, over the table's measured points (prefill,
    target step, verify and propose at every k), of MEDIAN_SE_PER_MAD * spread / sqrt(repeats). 0 for a table
    without recorded spreads (a poly fit, an older file)."""
    curves = [table.target_prefill, table.target_step, *table.verify.values(), *table.propose.values()]
    errors = [MEDIAN_SE_PER_MAD * spread / math.sqrt(n) for c in curves for spread, n in zip(c.spread, c.samples)
              if n > 0]
    return float(np.median(errors)) if errors else 0.0


def tie_set(predictions: dict[str, float], noise: float) -> list[str]:
    """The actions whose estimate lies within the cost model's noise of the least: within TIE_Z standard errors of
    a difference of two estimates (sqrt(2) * `noise`, relative) of it, least estimate first. The controller's
    choice among them is decided by the calibration's noise, so a run that chose another of them made no
    different decision (rakv.experiments.runcompare; docs/outputs.md)."""
    least = min(predictions.values())
    tolerance = TIE_Z * math.sqrt(2.0) * noise
    return sorted((a for a, v in predictions.items() if v <= least * (1.0 + tolerance)), key=predictions.get)


def break_even_alpha(table: CostTable, features: RequestFeatures, reuse: bool, k: int,
                     memory_penalty_s_per_byte: float = 0.0, tolerance: float = 1e-4) -> float | None:
    """Smallest alpha at which speculating with k beats k = 0 (None: not even at alpha = 1)."""
    baseline = estimate_latency(table, features, reuse, 0, 0.0, memory_penalty_s_per_byte)

    def gain(alpha):
        return baseline - estimate_latency(table, features, reuse, k, alpha, memory_penalty_s_per_byte)

    if gain(1.0) <= 0:
        return None
    if gain(0.0) > 0:
        return 0.0
    low, high = 0.0, 1.0
    while high - low > tolerance:  # latency is monotone decreasing in alpha
        mid = (low + high) / 2
        low, high = (low, mid) if gain(mid) > 0 else (mid, high)
    return high


def decode_break_even(draft_ratio: float, verify_ratios: dict[int, float]) -> tuple[float | None, int | None]:
    """The decode part of the regime: the least acceptance at which some k pays per token, and that k, for a draft
    step costing `draft_ratio` target steps and a verify of k + 1 tokens costing `verify_ratios[k]` steps. A round
    of k confirms E_k(alpha) tokens for k draft steps and one verify, so k pays where E_k(alpha) > k c + v_k
    (E_k rises from 1 at alpha = 0 to k + 1 at 1); prefill and copies, which the full model adds, are left out:
    this is the map's axis, the calibrated pairs' points come from `break_even_alpha`. (None, None): no k pays."""
    best: tuple[float | None, int | None] = (None, None)
    for k, verify in sorted(verify_ratios.items()):
        price = k * draft_ratio + verify
        if price >= k + 1:
            continue
        low, high = 0.0, 1.0
        if price <= 1.0:
            high = 0.0
        while high - low > 1e-6:
            mid = (low + high) / 2
            low, high = (mid, high) if expected_tokens_per_round(mid, k) <= price else (low, mid)
        if best[0] is None or high < best[0]:
            best = (high, k)
    return best


def acceptance_estimate(round_log: list[tuple[int, int]]) -> float | None:
    """Per-token acceptance alpha from rounds: accepted / (accepted + rounds that ended in a rejection).

    This is the maximum-likelihood estimate when each candidate is accepted independently with
    probability alpha until the first rejection; the plain accepted/proposed ratio is biased low.
    """
    accepted = sum(a for _, a in round_log)
    rejections = sum(a < p for p, a in round_log)
    if accepted + rejections == 0:
        return None
    return accepted / (accepted + rejections)


def break_even_rows(name: str, table, prompt_tokens: int, new_tokens: int) -> list[dict]:
    """Per k: the break-even alpha of a cold request (None: never) and the draft/target step-cost ratio."""
    features = RequestFeatures(prompt_tokens, 0, new_tokens)
    context = prompt_tokens + new_tokens / 2
    ratio = table.propose[1](context) / table.target_step(context)
    return [{"pair": name, "k": k, "break_even_alpha": break_even_alpha(table, features, False, k),
             "draft_target_cost_ratio": ratio, "target_step_s": table.target_step(context),
             "prompt_tokens": prompt_tokens, "new_tokens": new_tokens} for k in sorted(table.verify)]
