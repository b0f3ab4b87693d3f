"""The cost model C(r, k) (paper/main.tex, Method: "Cost model and controller"), as pure functions.

A `CostTable` holds the measured costs of the operations the decode loops perform (rakv.calibration
measures and stores them); `estimate_latency` is a pure function of (cost table, request features,
alpha), so the controller, the sensitivity analysis and the notebooks all call the same code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

@dataclass
class Curve:
    """A least-squares polynomial in one variable, with its fit quality."""

    coefficients: list[float]  # highest power first (numpy.polyval order)
    r2: float
    max_rel_error: float
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)

    def __call__(self, x: float) -> float:
        value = 0.0
        for c in self.coefficients:  # Horner in plain Python: ~10x faster than np.polyval on scalars
            value = value * x + c
        return max(value, 0.0)

    @classmethod
    def fit(cls, xs, ys, degree: int = 1) -> "Curve":
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        degree = min(degree, len(set(xs.tolist())) - 1)
        coefficients = np.polyfit(xs, ys, degree)
        predicted = np.polyval(coefficients, xs)
        total = float(((ys - ys.mean()) ** 2).sum())
        r2 = 1.0 - float(((ys - predicted) ** 2).sum()) / total if total > 0 else 1.0
        rel = np.abs(predicted - ys) / np.maximum(ys, 1e-12)
        return cls(coefficients.tolist(), r2, float(rel.max()), xs.tolist(), ys.tolist())


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

    def to_json(self) -> dict:
        row = asdict(self)
        row["verify"] = {str(k): v for k, v in row["verify"].items()}
        row["propose"] = {str(k): v for k, v in row["propose"].items()}
        return row

    @classmethod
    def from_json(cls, row: dict) -> "CostTable":
        row = dict(row)
        for name in ("target_prefill", "target_step", "proposer_prefill", "kv_copy"):
            row[name] = Curve(**row[name])
        for name in ("verify", "propose"):
            row[name] = {int(k): Curve(**v) for k, v in row[name].items()}
        return cls(**row)


@dataclass(frozen=True)
class RequestFeatures:
    prompt_tokens: int
    hit_tokens: int  # reusable positions if the store is used (0 on a miss)
    new_tokens: int
    exact_hit: bool = False

    @classmethod
    def from_hit(cls, prompt_tokens: int, hit, new_tokens: int) -> "RequestFeatures":
        """The features of a request that the store would offer `hit` (a rakv.cache.Hit)."""
        return cls(prompt_tokens, hit.reused_tokens, new_tokens, hit.exact)


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E_k(alpha) = (1 - alpha^(k+1)) / (1 - alpha): confirmed tokens per round (accepted + 1)."""
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def action_kv_bytes(table: CostTable, features: RequestFeatures, k: int) -> float:
    """K/V bytes an action holds at its peak: the target's whole sequence, plus the proposer's when k > 0."""
    length = features.prompt_tokens + features.new_tokens
    draft = table.proposer_kv_bytes_per_token * (length + k) if k else 0.0
    return table.target_kv_bytes_per_token * length + draft


def estimate_latency(table: CostTable, features: RequestFeatures, reuse: bool, k: int, alpha: float,
                     memory_penalty_s_per_byte: float = 0.0) -> float:
    """C(r, k): prefill of the non-reused part (+ proposer prefill when k > 0) + copy cost when r = 1
    + decode (N - 1 target steps for k = 0; (N - 1) / E_k(alpha) rounds of propose + verify for k > 0)
    + lambda * bytes. The first token comes from the prefill logits, hence N - 1."""
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
        cost += table.proposer_prefill(features.prompt_tokens + 1)
        rounds = steps / expected_tokens_per_round(alpha, k)
        cost += rounds * (table.propose[k](mid_context) + table.verify[k](mid_context))
    return cost + memory_penalty_s_per_byte * action_kv_bytes(table, features, k)


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
