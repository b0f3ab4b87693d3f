"""The one rule every verdict is read from: on which side of a threshold a confidence interval lies.

    ci_side((value, low, high), threshold) -> "above" | "below" | "straddles" | "missing"

"above" / "below": the whole interval lies strictly on that side; an interval touching or containing the threshold
"straddles" it. Without finite bounds the point value decides (`point_if_no_interval`, for statistics computed
once, without resampling), or the side is "missing". The claims (rakv.experiments.analysis), the serving goals
(rakv.experiments.serving_stats) and the paper's wording (rakv.experiments.report) map these four answers to their
own words.
"""

from __future__ import annotations

import math


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def ci_side(ci, threshold: float, *, point_if_no_interval: bool = True) -> str:
    value, low, high = ci
    if not _finite(value):
        return "missing"
    if not (_finite(low) and _finite(high)):
        if not point_if_no_interval:
            return "missing"
        low = high = value
    if low > threshold:
        return "above"
    if high < threshold:
        return "below"
    return "straddles"
