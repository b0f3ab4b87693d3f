"""How the paper and the README print a run's numbers: values and intervals as text (`pct`, `num`, `ci_text`),
plain text as LaTeX (`tex_escape`), and the cells of the claim rows and serving goals that the paper's LaTeX tables
(rakv.experiments.latex) and the README's Markdown (rakv.experiments.readme_writer) share.
"""

from __future__ import annotations

import re

from rakv.experiments.summary import ClaimAcrossRuns, ClaimRow, Summary
from rakv.experiments.summary_serving import Goal
from rakv.experiments.verdicts import ClaimVerdict


def tex_escape(text) -> str:
    """Plain text as LaTeX: its special characters escaped, comparisons and `alpha` as math (the default font
    encoding prints a bare < or > as an inverted mark), a break allowed after the dots of a module name."""
    out = str(text)
    for char, repl in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("$", r"\$"), ("#", r"\#"),
                       ("_", r"\_"), ("{", r"\{"), ("}", r"\}"), ("~", r"\textasciitilde{}"), ("^", r"\^{}")):
        out = out.replace(char, repl)
    for plain, math in (("<=", r"$\le$"), (">=", r"$\ge$"), ("!=", r"$\ne$"), ("<", r"$<$"), (">", r"$>$"),
                        ("|", r"$|$")):
        out = out.replace(plain, math)
    out = re.sub(r"\balpha = ([0-9.]+[0-9])", r"$\\alpha = \1$", out)
    out = re.sub(r"\balpha\b(?![^$]*\$)", r"$\\alpha$", out)
    return re.sub(r"\b(rakv(?:\.[a-z_\\]+)+)", lambda m: m.group(1).replace(".", r".\allowbreak{}"), out)


def missing(value) -> bool:
    return value is None or value != value


def _unsigned_zero(text: str) -> str:
    """'-0.0' -> '0.0': a value that rounds to zero has no sign to print."""
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def pct(value, digits: int = 1) -> str:
    return "--" if missing(value) else _unsigned_zero(f"{100 * value:.{digits}f}") + "\\%"


def num(value, digits: int = 3) -> str:
    return "--" if missing(value) else _unsigned_zero(f"{value:.{digits}f}")


def ci_text(triple, fmt=pct) -> str:
    value, low, high = triple
    return f"{fmt(value)} [{fmt(low)}, {fmt(high)}]" if not missing(low) else fmt(value)


def shown(verdict: str) -> str:
    """A verdict as printed: '--' where the claim's kind has none."""
    return "--" if verdict == ClaimVerdict.NOT_APPLICABLE else verdict


def shows_text(row: ClaimRow) -> bool:
    """Whether a claim row is printed by its text (a finding, or a value that could not be computed)."""
    return bool(row.text) and (missing(row.reproduced.value) or row.kind == "finding")


def claim_cells(row: ClaimRow, fmt) -> tuple[str, str, str]:
    """A claim row's reference, reproduced value (with its CI when it has one, else the value alone or the finding's
    text) and band, each through `fmt`."""
    reference = "--" if row.reference is None else fmt(row.reference)
    if shows_text(row):
        reproduced = row.text
    elif missing(row.reproduced.low):
        reproduced = fmt(row.reproduced.value)
    else:
        reproduced = f"{fmt(row.reproduced.value)} [{fmt(row.reproduced.low)}, {fmt(row.reproduced.high)}]"
    band = "--" if row.band_low is None else f"[{fmt(row.band_low)}, {fmt(row.band_high)}]"
    return reference, reproduced, band


def verdict_cells(row: ClaimRow, across: dict) -> tuple[str, str]:
    """A claim row's direction and magnitude as printed: its verdicts, and where several shipped runs were pooled and
    a run's verdict differs from the pooled one, every run's in parentheses (`across`: (key, configuration) ->
    ClaimAcrossRuns)."""
    runs = across.get((row.key, row.configuration))
    cells = []
    for pooled, each in ((row.direction, runs and runs.direction), (row.magnitude, runs and runs.magnitude)):
        differs = each and any(v != pooled for v in each)
        cells.append(shown(pooled) + (f" ({', '.join(shown(v) for v in each)})" if differs else ""))
    return cells[0], cells[1]


def headline_claims(summary: Summary) -> tuple[list[ClaimRow], dict[tuple[str, str], ClaimAcrossRuns]]:
    """The claim rows the paper and README print (pooled over the shipped runs where there are several) and each
    row's verdicts run by run, keyed by (key, configuration)."""
    if not summary.replication:
        return summary.claims, {}
    return summary.replication.claims, {(c.key, c.configuration): c for c in summary.replication.claim_runs}


def goal_value(g: Goal, fmt_pct=None) -> tuple[str, str]:
    """A serving goal's value and interval as text: a load in req/s (no interval), an acceptance difference, or a
    share; '--' where absent."""
    fmt_pct = fmt_pct or pct
    unit = g.unit
    fmt = {"alpha": lambda v: f"{v:+.3f}", "req/s": lambda v: f"{v:g} req/s"}.get(unit, fmt_pct)
    value = "--" if missing(g.ci.value) else fmt(g.ci.value)
    interval = "--" if missing(g.ci.low) else f"[{fmt(g.ci.low)}, {fmt(g.ci.high)}]"
    return value, interval


def isa_label(isa: str | None) -> str:
    """A hardware record's instruction sets as the kernels' path: AVX-512, AVX2 or what it says."""
    sets = set((isa or "").split("+"))
    if "avx512f" in sets:
        return "AVX-512"
    return "AVX2" if "avx2" in sets else tex_escape(isa or "ISA not recorded")
