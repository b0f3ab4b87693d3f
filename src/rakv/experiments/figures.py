"""Figures of the paper, each drawn from the results tables and saved as PNG and PDF.

The notebooks call these; keeping the drawing here makes it testable and keeps notebooks short. One look for all:
one panel per configuration where configurations differ, legends beside the axes (never over the data), plain
tick labels on log axes, one colour per k in every figure.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib import ticker  # noqa: E402

from rakv.experiments import oracle, study_stats  # noqa: E402
from rakv.experiments.summary import Feasibility
from rakv.experiments.summary_serving import ALL_ITERATIONS, IterationMape, LatencyMape, Slos
from rakv.runtime.actions import (  # noqa: E402
    ADAPTIVE,
    AR,
    BEST_FIXED,
    JOINT_K4,
    KV_ONLY,
    ORACLE,
    SPEC_K,
    SPEC_K4,
    Action,
)
from rakv.runtime.run_layout import split_calibration_stem  # noqa: E402

FIGURES = ("strategy_latency_throughput", "chosen_actions", "predicted_vs_measured", "regret_distribution",
           "speedup_vs_alpha", "cache_budget", "feasibility_gap", "regime_map",
           "acceptance_vs_break_even")
SAMPLING_FIGURES = ("acceptance_vs_temperature", "long_context_speedup")  # the sampling stage's, when it ran
STRATEGY_ORDER = [AR, KV_ONLY, SPEC_K4, JOINT_K4, BEST_FIXED, ADAPTIVE, ORACLE]
SCENARIO_ORDER = ["cold", "partial-50", "partial-90", "prefix", "exact"]


def k_colors() -> dict[int, tuple[float, float, float]]:
    """One colour per speculation depth k (k = 0 included), the same in every figure."""
    return dict(zip((0, *SPEC_K), sns.color_palette("colorblind", len(SPEC_K) + 1)))


def in_order(values, order) -> list:
    """The values present, in `order` first, then any others sorted."""
    present = set(values)
    return [v for v in order if v in present] + sorted(present - set(order))


PANEL_COLUMNS = 2  # panels per row: more configurations wrap to further rows, so a figure's type is not shrunk
#                    below what a reader can read when the figure is set at the text's width


def panels(count: int, width: float = 5.0, height: float = 3.8, sharey: bool = False):
    """`count` panels (one per configuration), PANEL_COLUMNS to a row, in reading order; a last row's empty
    places are removed."""
    columns = max(1, min(count, PANEL_COLUMNS))
    rows = -(-max(count, 1) // columns)
    fig, grid = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False, sharey=sharey)
    axes = list(grid.flat)
    for spare in axes[max(count, 1):]:
        spare.remove()
    return fig, axes[:max(count, 1)]


def legend_beside(ax, title: str | None = None, handles=None, labels=None) -> None:
    """The axes' legend (or the one given) to the right of the axes, outside the data."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    if handles:
        ax.legend(handles, labels, title=title, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                  frameon=False, fontsize=8, title_fontsize=8)


def plain_log(axis, at=None) -> None:
    """A log axis labelled 0.5, 1, 2, 5 ... instead of 5 x 10^-1; with `at`, ticks at those values only (the data's
    own rates, say)."""
    if at is not None:
        axis.set_major_locator(ticker.FixedLocator(sorted(set(float(v) for v in at))))
    else:
        axis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_locator(ticker.NullLocator())
    axis.set_minor_formatter(ticker.NullFormatter())


def style() -> None:
    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", font_scale=1.1)


def save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.tight_layout()
    # bbox "tight": legends placed beside the axes are inside the picture
    fig.savefig(paths[0], dpi=150, bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight", metadata={"CreationDate": None})  # no date: same data, same bytes
    plt.close(fig)
    return paths


def strategy_latency_throughput(runs: pd.DataFrame, out_dir: Path):
    """Mean latency and throughput per strategy and configuration, with the 95 % CIs over prompts of Table 1
    (rakv.experiments.study_stats.strategy_means; seaborn's own bootstrap would resample rows, which the prompts'
    repeats and scenarios make dependent)."""
    table = study_stats.strategy_means(runs)
    names = sorted(table.configuration.unique())
    order = [s for s in STRATEGY_ORDER if s in set(table.strategy)]
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6))
    width = 0.8 / max(len(names), 1)
    for ax, metric, label in ((axes[0], "latency_s", "latency per request (s)"),
                              (axes[1], "tokens_per_s", "throughput (tokens/s)")):
        for i, name in enumerate(names):
            rows = table[table.configuration == name].set_index("strategy").reindex(order)
            x = np.arange(len(order)) + (i - (len(names) - 1) / 2) * width
            low = (rows[metric] - rows[f"{metric}_low"]).clip(lower=0).fillna(0)
            high = (rows[f"{metric}_high"] - rows[metric]).clip(lower=0).fillna(0)
            ax.bar(x, rows[metric], width, yerr=[low, high], capsize=2, label=name)
        ax.set_xticks(np.arange(len(order)), order, rotation=30)
        ax.set(xlabel="strategy", ylabel=label)
    legend_beside(axes[1], "configuration", *axes[0].get_legend_handles_labels())
    return save(fig, out_dir, "strategy_latency_throughput")


def chosen_actions(runs: pd.DataFrame, out_dir: Path):
    """What RAKV-ASD chose, per configuration (one panel each), by scenario."""
    chosen = runs[oracle.adaptive_mask(runs)]
    names = sorted(chosen.configuration.unique())
    order = sorted(chosen.action.unique(), key=Action.parse)
    scenarios = in_order(chosen.scenario.unique(), SCENARIO_ORDER)
    fig, axes = panels(len(names), width=4.6, sharey=True)
    for ax, name in zip(axes, names):
        sns.countplot(data=chosen[chosen.configuration == name], x="action", hue="scenario", order=order,
                      hue_order=scenarios, ax=ax)
        ax.set_title(name)
        ax.set_xlabel("action chosen (r = reuse, k = draft tokens)")
        ax.set_ylabel("RAKV-ASD requests")
        ax.tick_params(axis="x", labelrotation=30)
        if ax is not axes[-1]:
            ax.get_legend().remove()
    legend_beside(axes[-1], "scenario")
    return save(fig, out_dir, "chosen_actions")


def predicted_vs_measured(runs: pd.DataFrame, out_dir: Path):
    """The cost model's prediction against the mean measured latency of every (scenario, action), per
    configuration, with its MAPE and Spearman rho (mean per scenario, and pooled) in the panel's title."""
    meas = oracle.measurements(runs)
    names = sorted(meas.configuration.unique())
    sweep = oracle.action_stats(meas)
    ks = sorted(sweep.k.unique())
    palette = {k: k_colors()[k] for k in ks}
    fig, axes = panels(len(names), width=4.6, height=4.4)
    low = min(sweep.measured_s.min(), sweep.predicted_s.min()) * 0.9
    high = max(sweep.measured_s.max(), sweep.predicted_s.max()) * 1.1
    for ax, name in zip(axes, names):
        part = meas[meas.configuration == name]
        points = sweep[sweep.configuration == name]
        per = study_stats.spearman_table(part).rho.mean()
        pooled = points[["predicted_s", "measured_s"]].corr(method="spearman").iloc[0, 1]
        mape = study_stats.mape_errors(part).error.mean()
        sns.scatterplot(data=points, x="measured_s", y="predicted_s", hue="k", hue_order=ks, palette=palette,
                        style="reuse", ax=ax)
        ax.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=1)
        ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel="measured latency (s)",
               ylabel="predicted latency (s)")
        plain_log(ax.xaxis)
        plain_log(ax.yaxis)
        ax.set_title(f"{name}\nMAPE {mape:.1%}; Spearman rho {per:.2f} per scenario, {pooled:.2f} pooled",
                     fontsize=9)
        if ax is not axes[-1]:
            ax.get_legend().remove()
    legend_beside(axes[-1])
    return save(fig, out_dir, "predicted_vs_measured")


def regret_distribution(runs: pd.DataFrame, out_dir: Path):
    """RAKV-ASD's cross-fitted regret per request, one panel per configuration, its mean marked."""
    choices = oracle.controller_choices(runs)
    names = sorted(choices.configuration.unique())
    fig, axes = panels(len(names), width=4.6, height=3.6)
    for ax, name in zip(axes, names):
        regret = choices[choices.configuration == name].regret * 100
        sns.histplot(x=regret, bins=20, ax=ax)
        ax.axvline(regret.mean(), color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{name}: mean {regret.mean():.1f}% (dashed)", fontsize=9)
        ax.set_xlabel("regret vs the cross-fitted oracle (% slower)")
        ax.set_ylabel("RAKV-ASD requests")
    return save(fig, out_dir, "regret_distribution")


def speedup_vs_alpha(alpha_model: pd.DataFrame, controlled: pd.DataFrame | None, crossover: pd.DataFrame,
                     out_dir: Path, scenario: str = "cold"):
    """Speedup of each k over k = 0 against alpha, crossover marked.

    Where controlled-acceptance runs exist, the model's curve is drawn for exactly those prompts
    beside the measured points; elsewhere (model-free proposers) the cost-model curves of a cold
    prompt of middle length are drawn.
    """
    configurations = sorted(alpha_model.configuration.unique())
    fig, axes = panels(len(configurations), width=5.2, height=4.4)
    palette = k_colors()
    for ax, name in zip(axes, configurations):
        points = controlled[controlled.configuration == name] if controlled is not None else pd.DataFrame()
        if len(points):
            for k, group in points.groupby("k"):
                model = group.groupby("alpha").predicted_speedup.mean()
                measured = group.groupby("alpha").measured_speedup.mean()
                ax.plot(model.index, model.values, color=palette.get(k), label=f"k={k} model")
                ax.scatter(group.alpha, group.measured_speedup, color=palette.get(k), marker="x",
                           label=f"k={k} measured")
                cross = study_stats.first_crossing(model.index.to_numpy(), model.to_numpy())
                seen = study_stats.first_crossing(measured.index.to_numpy(), measured.to_numpy())
                if cross is not None:
                    ax.axvline(cross, color=palette.get(k), linestyle="--", linewidth=1,
                               label=f"k={k} crossover: model {cross:.3f}"
                                     + (f", measured {seen:.3f}" if seen is not None else ""))
            ax.set_title(f"{name}: controlled acceptance, cold prompts")
        else:
            model = alpha_model[(alpha_model.configuration == name) & (alpha_model.scenario == scenario)]
            lengths = sorted(model.prompt_tokens.unique())
            length = lengths[len(lengths) // 2]
            model = model[model.prompt_tokens == length]
            base = model[model.k == 0].set_index("alpha").predicted_latency_s
            for k, group in model[model.k != 0].groupby("k"):
                speed = base / group.set_index("alpha").predicted_latency_s
                ax.plot(speed.index, speed.values, color=palette.get(k), label=f"k={k} model")
            cross = crossover[(crossover.configuration == name) & (crossover.scenario == scenario)
                              & (crossover.prompt_tokens == length)].break_even_alpha.min()
            if np.isfinite(cross):
                ax.axvline(cross, color="red", linestyle="--", linewidth=1, label=f"crossover {cross:.3f}")
            ax.set_title(f"{name}: cost model, {scenario} {length}-token prompt")
        ax.axhline(1.0, color="grey", linewidth=1)
        ax.set(xlabel="per-token acceptance alpha", ylabel="speedup over k = 0 (x)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    return save(fig, out_dir, "speedup_vs_alpha")


def cache_budget(budget: pd.DataFrame, out_dir: Path):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    sns.lineplot(data=budget, x="budget_mib", y="hit_rate", hue="configuration", marker="o", ax=axes[0])
    sns.lineplot(data=budget, x="budget_mib", y="mean_latency_s", hue="configuration", marker="o", ax=axes[1])
    budgets = sorted(budget.budget_mib.unique())
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xticks(budgets, [f"{b:g}" for b in budgets])
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("store budget (MiB)")
    axes[0].set_ylabel("hit rate (hits / lookups)")
    axes[1].set_ylabel("mean latency per request (s)")
    axes[0].get_legend().remove()
    legend_beside(axes[1], "configuration")
    return save(fig, out_dir, "cache_budget")


PAIR_NAMES = {  # calibration and twin names as the paper's text names them
    "gpt2large-gpt2medium-twin": "GPT-2 Large/Medium (twins)", "gpt2medium-gpt2-twin": "GPT-2 Medium/GPT-2 (twins)",
    "gpt2-distilgpt2-twin": "GPT-2/DistilGPT-2 (twins)", "smollm2-draft": "smollm2 (int8 self-draft)",
    "smollm2-prompt-lookup": "smollm2-lookup (prompt lookup)",
    "gpt2large-gpt2medium-twin-draft": "GPT-2 Large/Medium (twins)", "gpt2medium-gpt2-twin-draft":
    "GPT-2 Medium/GPT-2 (twins)", "gpt2-distilgpt2-twin-draft": "GPT-2/DistilGPT-2 (twins)"}


def pair_name(name: str) -> str:
    """A calibration's name as the paper names it; one at another precision than fp32 (`<pair>-<proposer>@q4_1`,
    rakv.runtime.run_layout.calibration_stem) says its precision, so the regime map has a point per precision."""
    stem, precision = split_calibration_stem(name)
    named = PAIR_NAMES.get(stem, stem)
    return named if precision == "fp32" else f"{named} at {precision}"


def feasibility_gap(gap: pd.DataFrame | None, feas: Feasibility, out_dir: Path):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    break_even = pd.DataFrame(feas.break_even or [])
    if len(break_even):  # cost side only: break-even alpha per k on the twins; never-paying k drawn at the top
        for pair, rows in break_even.groupby("pair"):
            alpha = rows.break_even_alpha.astype(float)
            line, = ax.plot(rows.k[alpha.notna()], alpha[alpha.notna()], marker="o", label=pair_name(pair))
            ax.scatter(rows.k[alpha.isna()], [1.04] * int(alpha.isna().sum()), marker="^", color=line.get_color())
        ax.set(ylim=(0, 1.08), xticks=sorted(break_even.k.unique()), xlabel="k (draft tokens)",
               ylabel="break-even acceptance alpha")
        ax.set_title("cost side only, on architecture twins (^: never pays)", fontsize=9)
        legend_beside(ax, "twin pair")
    elif gap is None or not len(gap):
        ax.axis("off")
        ax.text(0.5, 0.5, f"feasibility ({feas.configuration or '?'}):\n{feas.status}",
                ha="center", va="center", fontsize=11, wrap=True)
    else:
        sns.barplot(data=gap, x="scenario", y=gap.gap * 100, hue="dataset", ax=ax, errorbar=None)
        ax.axhline(0, color="grey", linewidth=1)
        ax.set_ylabel("best k != 0 vs best k = 0 (% slower)")
        ax.set_title(feas.configuration or "")
        legend_beside(ax, "dataset")
    return save(fig, out_dir, "feasibility_gap")


REFERENCE_CROSSOVER = (0.894, 0.973)  # the reference's crossover acceptance over its settings (claims.REFERENCE)


def calibration_band(points: pd.DataFrame) -> tuple[float, float] | None:
    """The within-run band of verify-4 / step: on the first machine of `points` (this run), the spread of that price
    over the calibrations of the pairs the study ran (one target, calibrated once per configuration); None without
    two such calibrations. A difference between machines inside it is not the machine's."""
    if points.empty or "faster_scenarios" not in points:
        return None
    first = points[(points.machine == points.machine.iloc[0]) & points.faster_scenarios.notna()]
    verify = first.verify4_ratio.dropna()
    return (float(verify.min()), float(verify.max())) if len(verify) >= 2 else None


def regime_map(points: pd.DataFrame, out_dir: Path):
    """The regime map: break-even acceptance over the draft step's price (in target steps). Lines: the decode
    part's break-even (rakv.runtime.costmodel.decode_break_even, least over k) at a few prices of verifying 5 tokens,
    a verify of k + 1 read linearly between 1 step at k = 0 and that price; hatched: the same break-even over this
    run's within-run calibration band of that price (`calibration_band`); band: the reference's crossover range
    over its settings. Points: every calibrated pair on every machine at its own draft price and its crossover from
    the full cost model (least over k; the draft's prefill and the copies included, so a point lies above its
    verify price's line), drawn at the top where the model finds no k that pays at that request; stars: the
    acceptance the study measured for the pair on that machine. Each point the study ran is labelled with what it
    measured: in how many scenarios the best k>0 was faster than the best k=0. Speculation pays where a star lies
    above its pair's point.

    `points`: rakv.experiments.analysis.regime_points (machine, pair, draft_ratio, verify4_ratio, crossover,
    measured_alpha, faster_scenarios, scenarios)."""
    from rakv.runtime.costmodel import decode_break_even

    def decode_line(verify: float) -> list[float]:
        alpha = [decode_break_even(c, {k: 1 + (verify - 1) * k / 4 for k in SPEC_K})[0] for c in draft]
        return [np.nan if a is None else a for a in alpha]

    fig, ax = plt.subplots(figsize=(9.0, 4.6))
    ax.axhspan(*REFERENCE_CROSSOVER, color="grey", alpha=0.25, label="reference's crossover range")
    draft = np.linspace(0.0, 0.8, 161)
    for verify, style in zip((1.0, 1.2, 1.4), ("solid", "dashed", "dotted")):
        ax.plot(draft, decode_line(verify), color="black", linewidth=0.8, linestyle=style,
                label=f"decode part, verify of 5 = {verify:g} steps")
    band = calibration_band(points)
    if band is not None:
        ax.fill_between(draft, decode_line(band[0]), decode_line(band[1]), facecolor="none", edgecolor="C3",
                        hatch="///", linewidth=0.0, label=f"decode part over this run's calibrations\n"
                                                          f"(verify of 5 = {band[0]:.2f}-{band[1]:.2f} steps)")
    machines = list(dict.fromkeys(points.machine))
    markers = dict(zip(machines, ("o", "s", "D", "^", "v")))
    pairs = list(dict.fromkeys(points.pair))
    colours = dict(zip(pairs, sns.color_palette("colorblind", len(pairs))))
    top = 1.04  # where a point goes when the cost model finds no k that pays at the request
    for row in points.itertuples():
        y = row.crossover if np.isfinite(row.crossover) else top
        ax.scatter(row.draft_ratio, y, marker=markers[row.machine], color=colours[row.pair], edgecolor="black",
                   s=50, zorder=3)
        if not np.isfinite(row.crossover) and pd.notna(getattr(row, "faster_scenarios", None)):
            ax.annotate(f"measured: k>0 faster in {int(row.faster_scenarios)}/{int(row.scenarios)}",
                        (row.draft_ratio, y), xytext=(8, 0), textcoords="offset points", fontsize=7, va="center")
        if np.isfinite(row.measured_alpha):
            ax.scatter(row.draft_ratio, row.measured_alpha, marker="*", color=colours[row.pair], edgecolor="black",
                       s=110, zorder=4)
    for pair in pairs:
        ax.scatter([], [], marker="s", color=colours[pair], label=pair_name(pair))
    for machine in machines:
        ax.scatter([], [], marker=markers[machine], color="white", edgecolor="black", label=machine)
    ax.scatter([], [], marker="*", color="white", edgecolor="black", s=110, label="acceptance measured in the study")
    ax.axhline(1.0, color="grey", linewidth=0.5)
    ax.text(0.79, top + 0.005, "cost model: no k pays at this request", fontsize=7, ha="right", va="bottom")
    ax.set(xlabel="draft step / target step", ylabel="acceptance (crossover or measured)", xlim=(-0.02, 0.8),
           ylim=(-0.02, 1.08))
    legend_beside(ax)
    return save(fig, out_dir, "regime_map")


def acceptance_vs_break_even(acceptance: pd.DataFrame, out_dir: Path):
    """Measured per-token acceptance (with its CI) beside the cost model's break-even acceptance, per
    configuration x dataset: speculation pays where the measured interval lies above the break-even mark."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels = [f"{r.configuration}\n{r.dataset}" for r in acceptance.itertuples()]
    x = np.arange(len(acceptance))
    err = np.vstack([acceptance.acceptance - acceptance.acceptance_low,
                     acceptance.acceptance_high - acceptance.acceptance])
    ax.errorbar(x - 0.1, acceptance.acceptance, yerr=np.nan_to_num(err), fmt="o", capsize=4,
                label="measured acceptance (95% CI)")
    never = acceptance.break_even_alpha.isna()
    ax.scatter(x[~never] + 0.1, acceptance.break_even_alpha[~never], marker="_", s=400, color="red",
               label="break-even acceptance (least over k)")
    if never.any():
        ax.scatter(x[never] + 0.1, [1.04] * int(never.sum()), marker="^", color="red", label="never pays")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set(ylim=(0, 1.08), ylabel="per-token acceptance alpha")
    legend_beside(ax)
    return save(fig, out_dir, "acceptance_vs_break_even")


# ---------------------------------------------------------------------------------------------
# The serving study (rakv.experiments.serving_stats)


def _errorbars(ax, rows: pd.DataFrame, x: str, metric: str, label: str, **style) -> None:
    rows = rows.sort_values(x)
    low = (rows[metric] - rows[f"{metric}_low"]).clip(lower=0).fillna(0)
    high = (rows[f"{metric}_high"] - rows[metric]).clip(lower=0).fillna(0)
    ax.errorbar(rows[x], rows[metric], yerr=[low, high], marker="o", capsize=3, label=label, **style)


def serving_chunking(cells: pd.DataFrame, slo_ms: float, out_dir: Path):
    """p99 ITL and median TTFT vs arrival rate, one line per chunking policy (CIs over repeats)."""
    fig, (left, right) = panels(2, width=3.9, height=3.3)
    part = cells[cells.family == "chunking"]
    for policy, rows in part.groupby("policy", sort=False):
        _errorbars(left, rows, "rate", "p99_itl_ms", policy)
        _errorbars(right, rows, "rate", "median_ttft_ms", policy)
    left.axhline(slo_ms, color="grey", linestyle="--", linewidth=1, label=f"ITL SLO {slo_ms:g} ms")
    left.set(xlabel="arrival rate (requests/s)", ylabel="p99 inter-token latency (ms)", yscale="log")
    right.set(xlabel="arrival rate (requests/s)", ylabel="median time to first token (ms)", yscale="log")
    plain_log(left.yaxis)
    plain_log(right.yaxis)
    for ax in (left, right):
        ax.set_xscale("log")
        plain_log(ax.xaxis, at=part.rate)
    legend_beside(right, "chunking", *left.get_legend_handles_labels())
    if left.get_legend() is not None:
        left.get_legend().remove()
    return save(fig, out_dir, "serving_chunking")


def serving_itl_distribution(requests: pd.DataFrame, out_dir: Path):
    """The ITL distribution (CDF over every gap of every repeat) per chunking policy, at the highest rate."""
    import json

    fig, ax = plt.subplots(figsize=(6, 3.6))
    part = requests[(requests.family == "chunking") & (requests.status == "ok")]
    if len(part):
        rate = part.rate.max()
        for policy, rows in part[part.rate == rate].groupby("policy", sort=False):
            gaps = np.sort([g * 1e3 for text in rows.itl_s for g in json.loads(text)])
            if len(gaps):
                ax.plot(gaps, np.arange(1, len(gaps) + 1) / len(gaps), label=policy)
        ax.set(xscale="log", xlabel="inter-token latency (ms)", ylabel="share of gaps <= x",
               title=f"interference trace at {rate:g} requests/s")
        plain_log(ax.xaxis)
        legend_beside(ax, "chunking")
    return save(fig, out_dir, "serving_itl_distribution")


def serving_goodput(cells: pd.DataFrame, slos_ms: dict[str, Slos], out_dir: Path):
    """Goodput vs arrival rate per speculation policy, one panel per speculation family (CIs over repeats)."""
    families = [f for f in ("speculation", "speculation-draft") if (cells.family == f).any()]
    fig, axes = panels(max(len(families), 1), width=4.6, height=3.8)
    for ax, family in zip(axes, families):
        part = cells[cells.family == family]
        for policy, rows in part.groupby("policy", sort=False):
            _errorbars(ax, rows, "rate", "goodput", policy, linewidth=2.5 if policy == ADAPTIVE else 1.2)
        slo = slos_ms.get(part.configuration.iloc[0]) if "configuration" in part else None
        title = family + (f"\n(TTFT {slo.slo_ttft_ms:.0f} ms, TPOT {slo.slo_tpot_ms:.0f} ms)" if slo else "")
        ax.set(xlabel="arrival rate (requests/s)", ylabel="goodput (requests/s within SLOs)", xscale="log",
               title=title)
        plain_log(ax.xaxis, at=part.rate)
    legend_beside(axes[-1], "policy", *axes[0].get_legend_handles_labels())
    for ax in axes[:-1]:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    return save(fig, out_dir, "serving_goodput")


def serving_chosen_k(chosen: pd.DataFrame, out_dir: Path):
    """Mean k per decoding request by batch size: SmartSpec's rule and RAKV-ASD under load, per family."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for (family, policy), rows in chosen.groupby(["family", "policy"]) if len(chosen) else ():
        ax.plot(rows.batch, rows.mean_k, marker="o", label=f"{policy} ({family})",
                linestyle="-" if family == "speculation" else "--")
    ax.set(xlabel="decoding requests in the iteration", ylabel="mean k chosen", ylim=(-0.1, None))
    legend_beside(ax, "policy (family)")
    return save(fig, out_dir, "serving_chosen_k")


def serving_break_even(break_even: pd.DataFrame, acceptance: float | None, out_dir: Path):
    """Break-even acceptance vs batch size per k, from the batch cost table; ^ at the top = never pays."""
    fig, ax = plt.subplots(figsize=(4.2, 3.2))
    colors = k_colors()
    for k, rows in break_even.groupby("k"):
        alpha = rows.break_even_alpha.astype(float)
        ax.plot(rows.batch[alpha.notna()], alpha[alpha.notna()], marker="o", color=colors.get(k), label=f"k = {k}")
        ax.scatter(rows.batch[alpha.isna()], [1.04] * int(alpha.isna().sum()), marker="^", color=colors.get(k))
    if acceptance is not None:
        ax.axhline(acceptance, color="grey", linestyle="--", linewidth=1, label=f"calibrated alpha {acceptance:.2f}")
    ax.set(xscale="log", xlabel="decoding requests (batch size)", ylabel="break-even acceptance alpha",
           ylim=(0, 1.08))
    plain_log(ax.xaxis)
    legend_beside(ax)
    return save(fig, out_dir, "serving_break_even")


def serving_mape(latency: dict[str, LatencyMape], iteration_mape: dict[str, IterationMape], threshold: float,
                 out_dir: Path):
    """Admission's service-time prediction under load, per family (and the batch-one prediction where there is
    one), and the batch cost model's per-iteration prediction (online-scaled and the table's alone): MAPE with CIs
    over repeats, the goal's threshold dashed."""
    fig, ax = plt.subplots(figsize=(4.4, 3.3))
    labels, triples = [], []
    for family, stats in latency.items():
        labels.append(f"service, {family}")
        triples.append(stats.served)
        if stats.batch_one[0] is not None and np.isfinite(stats.batch_one[0]):
            labels.append(f"service, {family}, batch-one")
            triples.append(stats.batch_one)
    if ALL_ITERATIONS in iteration_mape:
        labels += ["iteration, online scale", "iteration, table alone"]
        triples += [iteration_mape[ALL_ITERATIONS].scaled, iteration_mape[ALL_ITERATIONS].table]
    values = np.asarray([np.nan if t[0] is None else t[0] for t in triples], float) * 100
    lows, highs = (np.asarray([np.nan if t[i] is None else t[i] for t in triples], float) * 100 for i in (1, 2))
    err = [np.nan_to_num(np.clip(values - lows, 0, None)), np.nan_to_num(np.clip(highs - values, 0, None))]
    ax.barh(labels, values, xerr=err, capsize=3, color=sns.color_palette("colorblind", len(labels)))
    ax.axvline(threshold * 100, color="grey", linestyle="--", linewidth=1, label=f"goal {threshold:.0%}")
    ax.invert_yaxis()
    ax.set(xlabel="mean absolute percentage error (%)")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    return save(fig, out_dir, "serving_mape")


def acceptance_vs_temperature(checks: list, out_dir: Path):
    """Per configuration: measured acceptance (with its CI) and its closed form against temperature, per rule and k
    (rakv.experiments.sampling_stats.closed_form_checks)."""
    frame = pd.DataFrame([{"configuration": c.configuration, "temperature": c.temperature, "verify": c.verify,
                           "k": c.k, "measured": c.measured[0], "low": c.measured[1], "high": c.measured[2],
                           "closed_form": c.closed_form} for c in checks])
    names = in_order(frame.configuration.unique(), [])
    fig, axes = panels(len(names), sharey=True)
    colors = k_colors()
    for ax, name in zip(axes, names, strict=True):
        mine = frame[frame.configuration == name]
        for (k, rule), group in mine.groupby(["k", mine.verify.replace("greedy", "token")]):
            group = group.sort_values("temperature")
            style = "-" if rule == "token" else ":"
            ax.errorbar(group.temperature, group.measured, yerr=[group.measured - group.low,
                                                                 group.high - group.measured],
                        color=colors.get(k), linestyle=style, marker="o", capsize=3,
                        label=f"k = {k}, {rule}: measured")
            if rule == "token":
                ax.plot(group.temperature, group.closed_form, color=colors.get(k), marker="x", linestyle="none",
                        markersize=9, label=f"k = {k}: closed form")
        ax.set_title(name)
        ax.set_xlabel("temperature (0 = greedy)")
        ax.set_ylabel("acceptance per position reached")
    legend_beside(axes[-1])
    return save(fig, out_dir, "acceptance_vs_temperature")


def long_context_speedup(rows: list, out_dir: Path):
    """Latency relative to AR on the long-context workload against the documents' length, per store budget and
    strategy (geometric means over the documents of a length bin with 95 % CIs; below 1: faster than AR)."""
    frame = pd.DataFrame([{"configuration": r.configuration, "arm": f"{r.strategy}, {r.budget_mib:g} MiB",
                           "length": r.length_bin or "all", "ratio": r.vs_ar[0], "low": r.vs_ar[1],
                           "high": r.vs_ar[2]} for r in rows if r.strategy != AR])
    names = in_order(frame.configuration.unique(), [])
    fig, axes = panels(len(names), sharey=True)
    for ax, name in zip(axes, names, strict=True):
        mine = frame[frame.configuration == name]
        lengths = list(dict.fromkeys(mine.length))
        arms = list(dict.fromkeys(mine.arm))
        width = 0.8 / max(len(arms), 1)
        for i, arm in enumerate(arms):
            part = mine[mine.arm == arm].set_index("length").reindex(lengths)
            x = np.arange(len(lengths)) + (i - (len(arms) - 1) / 2) * width
            ax.bar(x, part.ratio, width, label=arm,
                   yerr=[(part.ratio - part.low).fillna(0), (part.high - part.ratio).fillna(0)], capsize=3)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(np.arange(len(lengths)), lengths)
        ax.set_xlabel("document length (tokens)")
        ax.set_ylabel("latency / AR's (same requests)")
        ax.set_title(name)
    legend_beside(axes[-1], "strategy, store")
    return save(fig, out_dir, "long_context_speedup")
