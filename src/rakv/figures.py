"""Figures of the paper, each drawn from the results tables and saved as PNG and PDF.

The notebooks call these; keeping the drawing here makes it testable and keeps notebooks short.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from rakv import analysis  # noqa: E402
from rakv.actions import SPEC_K, Action  # noqa: E402

FIGURES = ("strategy_latency_throughput", "chosen_actions", "predicted_vs_measured", "regret_distribution",
           "speedup_vs_alpha", "cache_budget", "feasibility_gap", "break_even_vs_cost_ratio",
           "acceptance_vs_break_even")
STRATEGY_ORDER = ["ar", "kv-only", "spec-k4", "joint-k4", "best-fixed", "rakv-asd", "oracle"]


def style() -> None:
    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", font_scale=1.1)


def save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    fig.tight_layout()
    fig.savefig(paths[0], dpi=150)
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def strategy_latency_throughput(runs: pd.DataFrame, out_dir: Path, seed: int = 0):
    s = analysis.strategy_latencies(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, metric, label in ((axes[0], "latency_s", "latency per request (s)"),
                              (axes[1], "tokens_per_s", "throughput (tokens/s)")):
        sns.barplot(data=s, x="strategy", y=metric, hue="configuration", order=STRATEGY_ORDER, ax=ax,
                    errorbar=("ci", 95), seed=seed, n_boot=1000)
        ax.set_xlabel("strategy")
        ax.tick_params(axis="x", labelrotation=30)
        ax.set_ylabel(label)
    axes[1].get_legend().remove()
    return save(fig, out_dir, "strategy_latency_throughput")


def chosen_actions(runs: pd.DataFrame, out_dir: Path):
    chosen = runs[(runs.kind == "strategy") & (runs.strategy == "rakv-asd")]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    order = sorted(chosen.action.unique(), key=Action.parse)
    sns.countplot(data=chosen, x="action", hue="scenario", order=order, ax=ax)
    ax.set_xlabel("action chosen by RAKV-ASD (r = reuse, k = draft tokens)")
    ax.set_ylabel("requests")
    return save(fig, out_dir, "chosen_actions")


def predicted_vs_measured(runs: pd.DataFrame, out_dir: Path):
    meas = analysis.measurements(runs)
    sweep = analysis.action_stats(meas)
    per = analysis.spearman_table(meas).rho.mean()
    pooled = sweep[["predicted_s", "measured_s"]].corr(method="spearman").iloc[0, 1]
    mape = analysis.mape_errors(meas).error.mean()
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    sns.scatterplot(data=sweep, x="measured_s", y="predicted_s", hue="k", style="reuse", palette="viridis", ax=ax)
    low = min(sweep.measured_s.min(), sweep.predicted_s.min()) * 0.9
    high = max(sweep.measured_s.max(), sweep.predicted_s.max()) * 1.1
    ax.plot([low, high], [low, high], color="grey", linestyle="--", linewidth=1)
    ax.set(xscale="log", yscale="log", xlabel="measured latency (s)", ylabel="predicted latency (s)")
    ax.text(0.03, 0.97, f"MAPE {mape:.1%}\nSpearman rho {per:.3f} per scenario (mean), {pooled:.3f} pooled",
            transform=ax.transAxes, va="top", fontsize=9, bbox={"facecolor": "white", "alpha": 0.8})
    return save(fig, out_dir, "predicted_vs_measured")


def regret_distribution(runs: pd.DataFrame, out_dir: Path):
    choices = analysis.controller_choices(runs)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    sns.histplot(data=choices, x=choices.regret * 100, hue="configuration", bins=20, multiple="stack", ax=ax)
    ax.axvline(choices.regret.mean() * 100, color="black", linestyle="--", linewidth=1, label="mean")
    ax.set_xlabel("regret vs the cross-fitted oracle (% slower, judged on a held-out repeat)")
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
    fig, axes = plt.subplots(1, len(configurations), figsize=(5.2 * len(configurations), 4), squeeze=False)
    palette = dict(zip(SPEC_K, sns.color_palette("colorblind", len(SPEC_K))))
    for ax, name in zip(axes[0], configurations):
        points = controlled[controlled.configuration == name] if controlled is not None else pd.DataFrame()
        if len(points):
            for k, group in points.groupby("k"):
                model = group.groupby("alpha").predicted_speedup.mean()
                measured = group.groupby("alpha").measured_speedup.mean()
                ax.plot(model.index, model.values, color=palette.get(k), label=f"k={k} model")
                ax.scatter(group.alpha, group.measured_speedup, color=palette.get(k), marker="x",
                           label=f"k={k} measured")
                cross = analysis.first_crossing(model.index.to_numpy(), model.to_numpy())
                seen = analysis.first_crossing(measured.index.to_numpy(), measured.to_numpy())
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
        ax.legend(fontsize=7)
    return save(fig, out_dir, "speedup_vs_alpha")


def cache_budget(budget: pd.DataFrame, out_dir: Path):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    sns.lineplot(data=budget, x="budget_mib", y="hit_rate", hue="configuration", marker="o", ax=axes[0])
    sns.lineplot(data=budget, x="budget_mib", y="mean_latency_s", hue="configuration", marker="o", ax=axes[1])
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("store budget (MiB)")
    axes[0].set_ylabel("hit rate (hits / lookups)")
    axes[1].set_ylabel("mean latency per request (s)")
    return save(fig, out_dir, "cache_budget")


def feasibility_gap(gap: pd.DataFrame | None, summary: dict, out_dir: Path):
    fig, ax = plt.subplots(figsize=(6, 3.6))
    break_even = pd.DataFrame(summary.get("break_even", []))
    if len(break_even):  # cost side only: break-even alpha per k on the twins; never-paying k drawn at the top
        for pair, rows in break_even.groupby("pair"):
            alpha = rows.break_even_alpha.astype(float)
            line, = ax.plot(rows.k[alpha.notna()], alpha[alpha.notna()], marker="o", label=pair)
            ax.scatter(rows.k[alpha.isna()], [1.04] * int(alpha.isna().sum()), marker="^", color=line.get_color())
        ax.set(ylim=(0, 1.08), xticks=sorted(break_even.k.unique()), xlabel="k (draft tokens)",
               ylabel="break-even acceptance alpha")
        ax.set_title(f"{summary.get('configuration', '')}: cost side only (twins); ^ = never pays", fontsize=9)
        ax.legend(fontsize=8)
    elif gap is None or not len(gap):
        ax.axis("off")
        ax.text(0.5, 0.5, f"feasibility ({summary.get('configuration', '?')}):\n{summary.get('status', 'missing')}",
                ha="center", va="center", fontsize=11, wrap=True)
    else:
        sns.barplot(data=gap, x="scenario", y=gap.gap * 100, hue="dataset", ax=ax, errorbar=None)
        ax.axhline(0, color="grey", linewidth=1)
        ax.set_ylabel("best k != 0 vs best k = 0 (% slower)")
        ax.set_title(summary.get("configuration", ""))
    return save(fig, out_dir, "feasibility_gap")


def break_even_vs_cost_ratio(break_even: pd.DataFrame, acceptance: dict[str, float], out_dir: Path):
    """Break-even alpha against the draft/target step-cost ratio, one point per (pair/proposer, k).

    `break_even` has columns pair, k, break_even_alpha (NaN: never pays), draft_target_cost_ratio;
    `acceptance` maps a pair/proposer to its measured per-token acceptance, drawn as a horizontal mark
    over its points (speculation pays where the mark lies above the point)."""
    fig, ax = plt.subplots(figsize=(8.4, 4.4))
    never = break_even.break_even_alpha.isna()
    sns.scatterplot(data=break_even[~never], x="draft_target_cost_ratio", y="break_even_alpha", hue="pair",
                    style="k", s=60, ax=ax)
    if never.any():
        ax.scatter(break_even[never].draft_target_cost_ratio, [1.04] * int(never.sum()), marker="^", color="grey",
                   label="never pays (any alpha)")
    for pair, alpha in acceptance.items():
        ratio = break_even[break_even.pair == pair].draft_target_cost_ratio
        if len(ratio):
            ax.hlines(alpha, ratio.min() * 0.8, ratio.max() * 1.25 + 0.02, color="black", linewidth=1.5)
            ax.annotate(f"measured alpha {alpha:.2f} ({pair})", (ratio.min() * 0.8, alpha + 0.012), fontsize=7,
                        va="bottom")
    ax.set(xlabel="draft step cost / target step cost", ylabel="break-even acceptance alpha", ylim=(0, 1.08))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save(fig, out_dir, "break_even_vs_cost_ratio")


def acceptance_vs_break_even(acceptance: pd.DataFrame, out_dir: Path):
    """Measured per-token acceptance (with its CI) beside the cost model's break-even acceptance, per
    configuration x dataset: speculation pays where the measured interval lies above the break-even mark."""
    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels = [f"{r.configuration}\n{r.dataset}" for r in acceptance.itertuples()]
    x = np.arange(len(acceptance))
    err = np.vstack([acceptance.acceptance - acceptance.acceptance_low, acceptance.acceptance_high - acceptance.acceptance])
    ax.errorbar(x - 0.1, acceptance.acceptance, yerr=np.nan_to_num(err), fmt="o", capsize=4,
                label="measured acceptance (95% CI)")
    never = acceptance.break_even_alpha.isna()
    ax.scatter(x[~never] + 0.1, acceptance.break_even_alpha[~never], marker="_", s=400, color="red",
               label="break-even acceptance (least over k)")
    if never.any():
        ax.scatter(x[never] + 0.1, [1.04] * int(never.sum()), marker="^", color="red", label="never pays")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set(ylim=(0, 1.08), ylabel="per-token acceptance alpha")
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, out_dir, "acceptance_vs_break_even")
