"""A generated table float (`rakvtable` around one `tabular`) reset as an upright longtable that runs over pages.

Why: a float that is both wide and long (a row per configuration, temperature and rule, several intervals per row)
can only be shrunk below readable type or turned sideways onto pages of its own, and such floats queue behind one
another far from the sentence that cites them (rakv.experiments.pdf_layout checks both). A longtable is not a
float: it stands where its sentence is and breaks across pages at the text's size, its head repeated. Its columns
share the text's width (the first a little wider: it names the configuration), each text column ragged, and a value
with its interval ('0.37 [0.29, 0.47]') sets its interval on a second line.
"""

from __future__ import annotations

import re

from rakv.runtime.errors import RakvError

FIRST_COLUMN = "2.6cm"  # the configuration's name (smollm2-lookup-q4_1 breaks at its hyphens)
INTERVAL = re.compile(r"(?<=\S) \[(?=[^\]]*\])")  # the space before an interval's bracket


def _braced(text: str, start: int) -> tuple[str, int]:
    """The contents of the brace group opening at text[start] ('{'), and the index after its closing brace."""
    if text[start] != "{":
        raise RakvError(f"longtable: expected '{{' at {start} of a generated table")
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i], i + 1
    raise RakvError("longtable: unbalanced braces in a generated table")


def columns_of(spec: str) -> int:
    """How many columns a simple tabular spec (l, r, c, p{..}, @{..} and >{..} allowed) has."""
    spec = re.sub(r"[@>]\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "", spec)
    spec = re.sub(r"p\{[^}]*\}", "p", spec)
    return sum(spec.count(c) for c in "lrcp")


def stacked(row: str) -> str:
    """A row whose values' intervals start a second line in their cells."""
    return INTERVAL.sub("\\\\newline[", row)


def as_longtable(block: str) -> str:
    """The `rakvtable` float `block` (one tabular, a caption, a label) as an upright longtable in a group of its
    own; RakvError where the block is not of that shape."""
    begin = block.find("\\begin{tabular}")
    if begin < 0 or block.count("\\begin{tabular}") != 1:
        raise RakvError("longtable: a generated table float must hold exactly one tabular")
    spec, body_start = _braced(block, begin + len("\\begin{tabular}"))
    end = block.index("\\end{tabular}", body_start)
    body = block[body_start:end].strip()
    caption_at = block.find("\\caption{")
    if caption_at < 0:
        raise RakvError("longtable: a generated table float must have a caption")
    caption, after = _braced(block, caption_at + len("\\caption"))
    label = re.search(r"\\label\{[^}]*\}", caption) or re.search(r"\\label\{[^}]*\}", block[after:])
    caption = re.sub(r"\\label\{[^}]*\}", "", caption)
    count = columns_of(spec)
    if count < 2:
        raise RakvError(f"longtable: a generated table of {count} column(s)")
    head, _, rows = body.partition("\\midrule")
    head = head.replace("\\toprule", "").strip()
    rows = "\n".join(stacked(line) for line in rows.replace("\\bottomrule", "").strip().splitlines())
    ragged = "\\raggedright\\arraybackslash"
    width = f"\\dimexpr(\\textwidth-{FIRST_COLUMN}-{2 * (count - 1)}\\tabcolsep)/{count - 1}\\relax"
    lines = [
        "{\\scriptsize\\setlength{\\tabcolsep}{2.5pt}\\setlength{\\LTcapwidth}{\\textwidth}",
        f"\\begin{{longtable}}{{@{{}}>{{{ragged}}}p{{{FIRST_COLUMN}}}"
        f"*{{{count - 1}}}{{>{{{ragged}}}p{{{width}}}}}@{{}}}}",
        f"\\caption{{{caption.strip()}{label.group(0) if label else ''}}}\\\\",
        "\\toprule", head, "\\midrule", "\\endfirsthead",
        "\\toprule", head, "\\midrule", "\\endhead",
        "\\bottomrule", "\\endfoot",
        rows,
        "\\end{longtable}\\par}",
    ]
    return "\n".join(lines) + "\n"
