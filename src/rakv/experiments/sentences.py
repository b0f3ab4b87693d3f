"""The sentences the summary carries (the paper and the README quote them): what the feasibility stage found."""

from __future__ import annotations

from rakv.experiments.summary import Feasibility


def cost_side_sentence(feas: Feasibility) -> str:
    """What the twins say about the feasibility pair: the least break-even alpha over k, and the k that never pay."""
    rows = [r for r in feas.break_even if r.pair == feas.twin]
    paying = [r for r in rows if r.break_even_alpha is not None]
    never = [str(r.k) for r in rows if r.break_even_alpha is None]
    if paying:
        best = min(paying, key=lambda r: r.break_even_alpha)
        text = f"pays only above alpha = {best.break_even_alpha:.2f} (k = {best.k})"
    else:
        text = "never pays, for any k, even at alpha = 1"
    if never and paying:
        text += f", never for k = {', '.join(never)}"
    return f"cost side only (architecture twins): {text}; acceptance needs the real weights"


def feasibility_verdict(feas: Feasibility) -> str:
    """The feasibility study's answer to "does k != 0 ever beat k = 0 on the larger pair?"."""
    if feas.break_even:
        return cost_side_sentence(feas)
    if feas.status == "ran":
        return "crosses" if feas.crossed else "does not cross"
    return feas.status
