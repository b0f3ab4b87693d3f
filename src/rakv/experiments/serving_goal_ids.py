"""A serving goal's name (docs/serving.md, "Fixed before the data"): its family, its kind and the baseline it is
judged against (`GoalId`), and how summary.json spells it (`GoalId.key`: "speculation/no_worse/k0"). The design's
goals are planned in rakv.experiments.serving_power and judged in rakv.experiments.serving_goals; the summary's
`Goal` record (rakv.experiments.summary) reads its name back with `GoalId.from_key`, the one place a key is parsed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class GoalKind(enum.StrEnum):
    """What a serving goal says (conf/experiment/serving.yaml names them per family). The first four are the
    speculation families' goodput goals, written as summary.json's `serving.pairs[].kind`."""
    NO_WORSE = "no worse"  # ours' goodput no worse than a baseline's within the margin, at every judged load
    HIGHER = "higher"  # ours' goodput higher than a baseline's at some judged load
    PART_ACCEPTANCE = "part: acceptance"  # the prefix-keyed acceptance's part: ours against the ablation arm
    PART_LOAD_AWARE = "part: load-aware k"  # load-aware k's part: the ablation arm against the fixed k
    THROUGHPUT = "throughput"  # ours' output throughput no worse than a baseline's at the highest load
    SLO_REACH = "slo reach"  # chunking: ours meets the ITL SLO up to a load at least every fixed budget's
    TTFT = "ttft"  # chunking: ours' median TTFT no worse than the baseline's
    LATENCY_MAPE = "latency mape"  # admission's service-time prediction error under a threshold
    ACCEPTANCE_ERROR = "acceptance error"  # the prefix-keyed acceptance's error lower than the EWMA's


# How GoalId.key spells each kind after "<family>/": a kind a family has once per baseline names the baseline
KEY_TAILS = {
    GoalKind.NO_WORSE: "no_worse/{rival}", GoalKind.HIGHER: "higher/{rival}",
    GoalKind.PART_ACCEPTANCE: "part/acceptance", GoalKind.PART_LOAD_AWARE: "part/load_aware",
    GoalKind.THROUGHPUT: "throughput/{rival}", GoalKind.SLO_REACH: "slo_reach", GoalKind.TTFT: "ttft",
    GoalKind.LATENCY_MAPE: "latency_mape", GoalKind.ACCEPTANCE_ERROR: "error",
}


@dataclass(frozen=True)
class GoalId:
    """A serving goal's name: its family, kind and the baseline the design judges it against (`rival`; None for the
    SLO-reach goal, whose rival the data pick, and the latency goal, which has none)."""
    family: str
    kind: GoalKind
    rival: str | None = None

    @property
    def key(self) -> str:
        """The goal as summary.json spells it: "<family>/<KEY_TAILS[kind]>"."""
        return f"{self.family}/" + KEY_TAILS[self.kind].format(rival=self.rival)

    @classmethod
    def from_key(cls, key: str) -> GoalId:
        """The goal `key` spells (summary.json's `serving.goals[].key`): the one place a key is read back. The rival
        is the key's where KEY_TAILS names one, else None (a part's or the TTFT goal's baseline is not in its key;
        rakv.experiments.summary_serving.Goal.rival holds the policy a goal was judged against)."""
        family, _, tail = key.partition("/")
        for kind, spelled in KEY_TAILS.items():
            head, rival, _ = spelled.partition("{rival}")
            if rival and tail.startswith(head) and len(tail) > len(head):
                return cls(family, kind, tail[len(head):])
            if not rival and tail == spelled:
                return cls(family, kind)
        raise ValueError(f"not a serving goal's key: {key!r}")
