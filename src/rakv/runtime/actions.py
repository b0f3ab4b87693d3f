"""The domain vocabulary, defined once: actions (r, k), strategy names, and the k values calibrated.

An *action* is the pair (reuse r, speculation depth k) of paper/main.tex (Method: "Cost model and
controller"); its label is `r1k4`. A fixed strategy is a fixed action (`ar` = r0k0, `kv-only` =
r1k0, `spec-k4` = r0k4, `joint-k4` = r1k4); `rakv-asd` lets the controller choose one per request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rakv.runtime.errors import RakvError

SPEC_K = (1, 2, 4, 6, 8)  # speculation depths calibrated and offered to the controller (k = 0 besides)
ADAPTIVE = "rakv-asd"
AR = "ar"  # r0k0: the target alone
KV_ONLY = "kv-only"  # r1k0: the store's prefix, no speculation


def spec(k: int) -> str:
    """The fixed strategy r0k`k`: speculation without reuse."""
    return f"spec-k{k}"


def joint(k: int) -> str:
    """The fixed strategy r1k`k`: reuse and speculation."""
    return f"joint-k{k}"


FIXED_STRATEGIES = (AR, KV_ONLY, *(spec(k) for k in SPEC_K), *(joint(k) for k in SPEC_K))
BASELINE_K = 4  # the fixed baselines' depth (paper/main.tex: "Baselines for the controller: KV-only, Joint-k4, ...")
SPEC_K4, JOINT_K4 = spec(BASELINE_K), joint(BASELINE_K)
# the study's two comparators in hindsight (rakv.experiments.oracle computes them); its tables list them among the
# strategies, so their names live here too
BEST_FIXED = "best-fixed"
ORACLE = "oracle"

_LABEL = re.compile(r"(?:([a-z][a-z0-9-]*):)?r([01])k(\d+)")  # `heads:r0k4`: a configuration of several proposers
_STRATEGY = re.compile(r"(spec|joint)-k(\d+)")


@dataclass(frozen=True, order=True)
class Action:
    reuse: bool
    k: int
    proposer: str = ""  # which proposer speculates, in a configuration of several (conf/configuration/*-all.yaml);
    # "" for one proposer's actions and for k = 0 (no proposer runs), whose labels stay `r1k4`, `r0k0`

    def __post_init__(self):
        if self.proposer and not self.k:
            raise RakvError(f"a k = 0 action runs no proposer: '{self.proposer}:r{int(self.reuse)}k0' is not one")

    @property
    def label(self) -> str:
        own = f"r{int(self.reuse)}k{self.k}"
        return f"{self.proposer}:{own}" if self.proposer else own

    def of_proposer(self, proposer: str) -> Action:
        """This action with `proposer` speculating (k = 0 stays unqualified: it does not depend on the proposer)."""
        return Action(self.reuse, self.k, proposer if self.k else "")

    @staticmethod
    def is_label(text: str) -> bool:
        return _LABEL.fullmatch(text) is not None

    @classmethod
    def parse(cls, label: str) -> Action:
        """The action of a label such as `r1k4` or `heads:r0k4` (as the study's `action` column holds)."""
        match = _LABEL.fullmatch(label)
        if not match or (int(match[3]) and int(match[3]) not in SPEC_K) or (match[1] and not int(match[3])):
            raise RakvError(f"'{label}' is not an action label (r0k0 .. r1k{SPEC_K[-1]}, or <proposer>:r0k1 .. "
                            f"<proposer>:r1k{SPEC_K[-1]})")
        return cls(match[2] == "1", int(match[3]), match[1] or "")

    @classmethod
    def of_strategy(cls, name: str) -> Action:
        """The fixed action of a baseline strategy name."""
        if name == AR:
            return cls(False, 0)
        if name == KV_ONLY:
            return cls(True, 0)
        match = _STRATEGY.fullmatch(name)
        if match and int(match[2]) in SPEC_K:
            return cls(match[1] == "joint", int(match[2]))
        raise RakvError(f"unknown strategy '{name}' (a fixed one: {', '.join(FIXED_STRATEGIES)}; or {ADAPTIVE})")


def parse_k_set(values) -> tuple[int, ...]:
    """A sorted, validated set of speculation depths: 0 and values of SPEC_K only."""
    try:
        k_set = tuple(sorted({int(v) for v in values}))
    except (TypeError, ValueError):
        raise RakvError(f"k_set must be integers, got {values!r}") from None
    if not k_set or any(k != 0 and k not in SPEC_K for k in k_set):
        raise RakvError(f"k_set values must be 0 or one of {SPEC_K} (the calibrated depths), got {list(values)}")
    return k_set
