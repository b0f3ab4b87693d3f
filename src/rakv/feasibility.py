"""The feasibility study: the main study's machinery on a bigger pair (conf/feasibility.yaml), action sweep only,
reporting how far the best k != 0 action is from the best k = 0 one per scenario; skipped with the reason
when the pair's weights cannot be had.
"""

from __future__ import annotations

import json

import pandas as pd
from omegaconf import DictConfig

from rakv.actions import Action
from rakv.config import configuration, results_dir
from rakv.errors import WeightsUnavailable
from rakv.records import write_atomic, write_parquet
from rakv.study import run_main_study


def run_feasibility(cfg: DictConfig) -> None:
    """The main-study machinery on the feasibility pair (action sweep only); skipped when weights are missing."""
    out_dir = results_dir(cfg) / "feasibility"
    out_dir.mkdir(parents=True, exist_ok=True)
    feas = cfg.profile.feasibility
    try:
        path = run_main_study(cfg, out_dir / "study")
    except WeightsUnavailable as exc:
        summary = {"status": "skipped: weights unavailable", "configuration": feas.configuration, "reason": str(exc)}
        write_atomic(out_dir / "summary.json", json.dumps(summary, indent=1))
        print(f"feasibility: skipped: weights unavailable ({exc})", flush=True)
        return
    runs = pd.read_parquet(path)
    per_scenario = []
    for (dataset, prompt_id, scenario), group in runs.groupby(["dataset", "prompt_id", "scenario"]):
        by_action = group.groupby("action").latency_s.mean()
        speculative = [Action.parse(label).k > 0 for label in by_action.index]
        k0 = by_action[[not s for s in speculative]].min()
        spec = by_action[speculative]
        per_scenario.append({"dataset": dataset, "prompt_id": prompt_id, "scenario": scenario,
                             "best_k0_s": float(k0), "best_spec_s": float(spec.min()), "best_spec_action": spec.idxmin(),
                             "gap": float(spec.min() / k0 - 1)})
    table = pd.DataFrame(per_scenario)
    write_parquet(per_scenario, out_dir / "gap.parquet")
    pair = configuration(feas.configuration)
    calibration = json.loads((results_dir(cfg) / "calibration" / f"{pair.pair}-{pair.proposer}.json").read_text())
    summary = {"status": "ran", "configuration": feas.configuration, "scenarios": len(table),
               "gap_min": float(table.gap.min()), "gap_max": float(table.gap.max()),
               "gap_mean": float(table.gap.mean()), "crossed": bool((table.gap < 0).any()),
               "calibrated_alpha": calibration["acceptance"]}
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=1))
    print(f"feasibility: best k != 0 vs k = 0 gap {summary['gap_min']:+.1%} to {summary['gap_max']:+.1%} "
          f"over {len(table)} scenarios; crossed: {summary['crossed']}", flush=True)
