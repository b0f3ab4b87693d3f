"""The engine before and after: full runs of one profile, measured with different engines, side by side.

Read from each run's own tables (calibration/*.json, study/metadata.json, study/runs.parquet, summary.json,
feasibility/summary.json), nothing typed in: per configuration, the calibrated target step, draft step and
verify(k + 1) / step at 256 tokens of context, the calibrated target and draft prefill at 64-512 tokens, the
break-even acceptance the cost model gives, the acceptance measured in the study, the best fixed action, the
action the controller chose most, and how often it speculated. The analysis stage writes it as
`engine_comparison.tex` when the profile names earlier runs (conf/profile: profile.before_engines, oldest first),
and the sentences under it follow the signs of the differences between the last earlier engine and this run.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from rakv.experiments.metadata import read_run_metadata
from rakv.experiments.summary import read_engine_facts, read_feasibility
from rakv.runtime.actions import ADAPTIVE
from rakv.runtime.costmodel import Curve, read_cost_table
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import ABSENT
from rakv.runtime.proposers import proposer_type
from rakv.runtime.run_layout import RunLayout

CONTEXT = 256  # tokens of context at which steps are read off the calibration tables
PREFILL_TOKENS = (64, 128, 256, 512)  # prompt lengths at which prefills are read off the calibration tables


def _at(curve: Curve, x: float = CONTEXT) -> float:
    return curve(x)


def _prefill(curve: Curve | None) -> dict[int, float]:
    """Seconds of a calibrated prefill at PREFILL_TOKENS (empty without a calibration)."""
    if curve is None:
        return {}
    return {n: _at(curve, n) for n in PREFILL_TOKENS}


def _known(record, name: str):
    """A record's field, None where the record or the field is absent (a part the run did not compute)."""
    value = getattr(record, name) if record else None
    return None if value is ABSENT else value


def precision_of(runs: pd.DataFrame) -> str:
    """The target's precision of one configuration's runs, from their own column (a run from before precision was a
    factor of the study has none: fp32)."""
    return str(runs.precision.iloc[0]) if "precision" in runs and len(runs) else "fp32"


def engine_rows(results: Path, label: str | None = None) -> list[dict]:
    """One row per study configuration (and per twin pair of the feasibility stage) of a finished run; `label`
    names its engine in the table (default: its kernels mode)."""
    results = Path(results)
    layout = RunLayout.of(results)
    meta = read_run_metadata(layout)
    facts = read_engine_facts(results)
    runs = pd.read_parquet(layout.study.runs)
    kernels = label or meta.kernels
    acceptance = pd.DataFrame([vars(row) for row in facts.acceptance])
    rows = []
    for configuration, best_fixed_action in facts.best_fixed_action.items():
        crossover = facts.crossover.get(configuration)
        key = meta.calibration_keys.get(configuration)  # the run's own: its pair and proposer's name
        if key is None:
            raise RakvError(f"{layout.study.metadata}: no calibration key for configuration "
                            f"'{configuration}' (a study run by an older version)")
        pair, proposer = key.pair_name, key.proposer
        drafts = proposer_type(proposer).has_draft_model
        own = runs[runs.configuration == configuration]
        table = read_cost_table(layout.calibration(pair, proposer, precision_of(own)))
        step = _at(table.target_step)
        chosen = own[own.strategy == ADAPTIVE]
        shares = chosen.action.value_counts(normalize=True)
        measured = acceptance[acceptance.configuration == configuration] if len(acceptance) else acceptance
        rows.append({
            "configuration": configuration, "kernels": kernels, "target_step_ms": step * 1e3,
            "draft_step_ms": _at(table.propose[1]) * 1e3 if drafts else None,
            "verify_over_step": {k: _at(table.verify[k]) / step for k in (1, 2, 4) if k in table.verify},
            "target_prefill_s": _prefill(table.target_prefill),
            "draft_prefill_s": _prefill(table.proposer_prefill) if drafts else {},
            "break_even_alpha": _known(crossover, "median"),
            "break_even_never": _known(crossover, "never"),
            "break_even_settings": _known(crossover, "settings"),
            "acceptance": float(measured.acceptance.mean()) if len(measured) else None,
            "best_fixed_action": best_fixed_action,
            "controller_action": shares.index[0] if len(shares) else None,
            "controller_share": float(shares.iloc[0]) if len(shares) else None,
            "controller_speculates": float((chosen.k > 0).mean()) if len(chosen) else None,
        })
    feasibility = read_feasibility(results)
    if feasibility.twins:
        for pair in feasibility.twins:
            paying = [r.break_even_alpha for r in feasibility.break_even if r.pair == pair
                      and r.break_even_alpha is not None]
            path = layout.calibration(pair, "draft")
            table = read_cost_table(path) if path.exists() else None
            step = _at(table.target_step) if table else None
            rows.append({"configuration": pair, "kernels": kernels,
                         "target_step_ms": step * 1e3 if step else None,
                         "draft_step_ms": _at(table.propose[1]) * 1e3 if table else None,
                         "verify_over_step": {k: _at(table.verify[k]) / step for k in (1, 2, 4)
                                              if table and k in table.verify},
                         "target_prefill_s": _prefill(table.target_prefill if table else None),
                         "draft_prefill_s": _prefill(table.proposer_prefill if table else None),
                         "break_even_alpha": min(paying) if paying else None, "break_even_never": None,
                         "break_even_settings": None, "acceptance": None, "best_fixed_action": None,
                         "controller_action": None, "controller_share": None, "controller_speculates": None})
    return rows


def _fmt(value, spec: str = ".1f", missing: str = "--") -> str:
    return missing if value is None else format(value, spec)


def comparison_table(runs: list[list[dict]]) -> str:
    """LaTeX tabular: per configuration, one line per engine (oldest first); prefills in seconds."""
    prefill = " & ".join(f"{n}" for n in PREFILL_TOKENS)
    lines = [r"\begin{tabular}{llrrrrr" + "r" * 2 * len(PREFILL_TOKENS) + "rrll}", r"\toprule",
             r" & & & & & & & \multicolumn{" + str(len(PREFILL_TOKENS)) + r"}{c}{target prefill (s)} & \multicolumn{"
             + str(len(PREFILL_TOKENS)) + r"}{c}{draft prefill (s)} & & & & \\",
             r"configuration & engine & step (ms) & draft (ms) & $v_1$ & $v_2$ & $v_4$ & " + prefill + " & " + prefill
             + r" & $\alpha^\ast$ & $\hat\alpha$ & best fixed & controller (share) \\", r"\midrule"]
    by_run = [{r["configuration"]: r for r in rows} for rows in runs]
    for configuration in by_run[0]:
        for rows in by_run:
            r = rows.get(configuration)
            if r is None:
                continue
            v = r["verify_over_step"]
            share = (f"{r['controller_action']} ({r['controller_share']:.0%})".replace("%", r"\%")
                     if r["controller_action"] else "--")
            lines.append(" & ".join([
                r["configuration"].replace("_", r"\_"), r["kernels"].replace("_", r"\_"), _fmt(r["target_step_ms"]),
                _fmt(r["draft_step_ms"]), _fmt(v.get(1), ".2f"), _fmt(v.get(2), ".2f"), _fmt(v.get(4), ".2f"),
                *[_fmt(r.get("target_prefill_s", {}).get(n), ".3f") for n in PREFILL_TOKENS],
                *[_fmt(r.get("draft_prefill_s", {}).get(n), ".3f") for n in PREFILL_TOKENS],
                _fmt(r["break_even_alpha"], ".3f", "never"), _fmt(r["acceptance"], ".2f"),
                r["best_fixed_action"] or "--", share]) + r" \\")
        lines.append(r"\midrule")
    lines[-1] = r"\bottomrule"
    lines.append(r"\end{tabular}")
    return "\n".join(lines) + "\n"


def prefill_sentence(configuration: str, runs: list[list[dict]]) -> str:
    """How many of this run's calibrated prefill points (target and draft) are faster than each earlier engine's,
    naming those that are not."""
    now = {r["configuration"]: r for r in runs[-1]}.get(configuration)
    parts = []
    for rows in runs[:-1]:
        then = {r["configuration"]: r for r in rows}.get(configuration)
        if now is None or then is None:
            continue
        points = [(name, n, then[key][n], now[key][n]) for name, key in (("target", "target_prefill_s"),
                                                                           ("draft", "draft_prefill_s"))
                  for n in PREFILL_TOKENS if n in then.get(key, {}) and n in now.get(key, {})]
        if not points:
            continue
        slower = [f"the {name} at {n} tokens ({b:.3f} vs {a:.3f} s)" for name, n, b, a in points if a >= b]
        parts.append(f"faster than {then['kernels']} at {len(points) - len(slower)} of {len(points)} points"
                     + (f" (not: {', '.join(slower)})" if slower else ""))
    return (f" Its calibrated prefills ({configuration}: target and draft, {PREFILL_TOKENS[0]}-{PREFILL_TOKENS[-1]} "
            "tokens) are " + "; ".join(parts) + ".") if parts else ""


def comparison_sentences(runs: list[list[dict]]) -> str:
    """The last earlier engine against this run, per configuration; prefills against every earlier engine."""
    before, after = runs[-2], runs[-1]
    """What moved, worded by the sign of each change; where the draft's break-even acceptance stays above the
    measured acceptance, by how much it still misses."""
    after_by = {r["configuration"]: r for r in after}
    text = []
    for b in before:
        a = after_by.get(b["configuration"])
        if a is None or a["target_step_ms"] is None or b["target_step_ms"] is None:
            continue
        ratio = a["target_step_ms"] / b["target_step_ms"]
        verb = "fell" if ratio < 1 else "rose" if ratio > 1 else "stayed"
        sentence = (f"For {b['configuration']}, the target step at {CONTEXT} tokens of context {verb} from "
                    f"{b['target_step_ms']:.1f} to {a['target_step_ms']:.1f} ms ({ratio:.2f}x)")
        if a["draft_step_ms"] is not None and b["draft_step_ms"] is not None:
            sentence += (f", the draft step from {b['draft_step_ms']:.1f} to {a['draft_step_ms']:.1f} ms "
                         f"({b['draft_step_ms'] / b['target_step_ms']:.2f} to "
                         f"{a['draft_step_ms'] / a['target_step_ms']:.2f} of a target step)")
        sentence += "."
        if a["break_even_alpha"] is None and a["break_even_settings"]:
            sentence += (f" The cost model now finds no k that pays in any of its {a['break_even_settings']} settings"
                         + (f" (before: a median break-even acceptance of {b['break_even_alpha']:.3f} over the "
                            f"{b['break_even_settings'] - b['break_even_never']} settings where one paid)"
                            if b["break_even_alpha"] is not None and b["break_even_settings"] else "")
                         + (f", although the study measured an acceptance of {a['acceptance']:.2f}"
                            if a["acceptance"] is not None else "") + ".")
        elif a["break_even_alpha"] is not None:
            if b["break_even_alpha"] is not None:
                sentence += (f" Its break-even acceptance moved from {b['break_even_alpha']:.3f} to "
                             f"{a['break_even_alpha']:.3f}")
            else:
                paying = (f" in {a['break_even_settings'] - a['break_even_never']} of its {a['break_even_settings']}"
                          " settings" if a["break_even_settings"] else "")
                sentence += (" Where the cost model found no k that paid before, it now finds one" + paying
                             + f", at a median break-even acceptance of {a['break_even_alpha']:.3f}")
            if a["acceptance"] is not None:
                gap = a["break_even_alpha"] - a["acceptance"]
                sentence += (f"; the study measured an acceptance of {a['acceptance']:.2f}, "
                             + (f"{gap:.3f} below it: at that acceptance speculation does not pay."
                                if gap > 0 else f"{-gap:.3f} above it: at that acceptance speculation pays."))
            else:
                sentence += "."
        if a["controller_speculates"] is not None and b["controller_speculates"] is not None:
            sentence += (f" The controller speculated in {b['controller_speculates']:.0%} of its runs before and "
                         f"{a['controller_speculates']:.0%} after (most often {a['controller_action']}).")
        sentence += prefill_sentence(b["configuration"], runs)
        text.append(sentence.replace("%", r"\%"))
    return "\n\n".join(text) + "\n"


def write_engine_comparison(befores: list[Path], after: Path, out_dir: Path) -> list[Path]:
    """The table of every earlier run (oldest first) and this one, and the sentences of the last earlier one
    against this one (prefills against each). Earlier engines are labelled by their folder's name after the
    profile's (offline-fast-kernels: fast-kernels)."""
    runs = [engine_rows(path, Path(path).name.split("-", 1)[-1]) for path in befores]
    runs.append(engine_rows(after, f"{engine_rows_label(after)} (this run)"))
    table, sentences = Path(out_dir) / "engine_comparison.tex", Path(out_dir) / "engine_comparison_text.tex"
    table.write_text(comparison_table(runs))
    sentences.write_text(comparison_sentences(runs))
    return [table, sentences]


def engine_rows_label(results: Path) -> str:
    return read_run_metadata(RunLayout.of(results)).kernels
