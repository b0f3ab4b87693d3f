"""What the built paper draws outside its text area: from LaTeX's log each overfull line and each float too large
for the page, and from the PDF (pypdfium2) every character outside the margins main.tex sets;
paper/build/<name>/layout.json keeps it beside the PDF (`PdfLayout`, tests/test_paper_text.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import optional, read_record, to_json
from rakv.runtime.paths import ROOT


@dataclass(frozen=True)
class OutsideRun:
    """A run of characters drawn outside the text area: its page (from 1), text and box (pt: left, bottom, right,
    top)."""
    page: int
    text: str
    box: list[float]


@dataclass(frozen=True)
class PdfLayout:
    """layout.json: each overfull line's excess width and each float too large for the page (pt, from LaTeX's log)
    and, when the PDF was read, every run of characters outside the text area."""
    overfull_hbox_pt: list[float]
    float_too_large_pt: list[float]
    words_outside: list[OutsideRun] = optional()  # absent: the report was made from the log alone


def layout_report(log: str, pdf: Path | None = None) -> PdfLayout:
    """What runs outside the text area: LaTeX's log (each overfull line's excess width and each float too large
    for the page, pt) and, given the built `pdf`, every character drawn outside it (`words_outside`)."""
    overfull = [float(x) for x in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    too_large = [float(x) for x in re.findall(r"Float too large for page by ([\d.]+)pt", log)]
    if pdf is None:
        return PdfLayout(overfull, too_large)
    return PdfLayout(overfull, too_large, words_outside(pdf))


def write_pdf_layout(layout: PdfLayout, path: Path) -> PdfLayout:
    Path(path).write_text(json.dumps(to_json(layout), indent=1) + "\n")
    return layout


def read_pdf_layout(path: Path) -> PdfLayout:
    return read_record(PdfLayout, path, "the paper stage writes it beside the PDF")


def text_margin_pt(source: Path = ROOT / "paper" / "main.tex") -> float:
    """The page margin main.tex gives geometry (\\usepackage[margin=...cm]{geometry}), in PDF points."""
    found = re.search(r"\\usepackage\[margin=([\d.]+)cm\]\{geometry\}", Path(source).read_text())
    if not found:
        raise RakvError(f"{source}: no \\usepackage[margin=...cm]{{geometry}} to read the text area from")
    return float(found.group(1)) * 72 / 2.54


def words_outside(pdf: Path, margin_pt: float | None = None, tolerance_pt: float = 1.0,
                  descender_pt: float = 3.5) -> list[OutsideRun]:
    """Every run of characters of `pdf` drawn outside the text area (the page less `margin_pt` on each side), per
    page: its text and box (pt). Allowed outside: the page number, centred in the footer, and the last line's
    descenders (up to `descender_pt` below the area: TeX sets that line's baseline on its bottom edge)."""
    import pypdfium2 as pdfium

    margin = text_margin_pt() if margin_pt is None else margin_pt
    found = []
    document = pdfium.PdfDocument(str(pdf))
    try:
        for number in range(len(document)):
            page = document[number]
            width, height = page.get_size()
            text = page.get_textpage()
            run: dict | None = None
            for i in range(text.count_chars()):
                char = text.get_text_range(i, 1)
                if not char.strip():
                    run = None
                    continue
                left, bottom, right, top = text.get_charbox(i)
                footer = top < margin - 10 and char.isdigit() and abs((left + right) / 2 - width / 2) < 20
                inside = (left >= margin - tolerance_pt and right <= width - margin + tolerance_pt
                          and top <= height - margin + tolerance_pt and bottom >= margin - descender_pt)
                if inside or footer:
                    run = None
                    continue
                if run is None:
                    run = {"page": number + 1, "text": "", "box": [left, bottom, right, top]}
                    found.append(run)
                run["text"] += char
                run["box"] = [min(run["box"][0], left), min(run["box"][1], bottom), max(run["box"][2], right),
                              max(run["box"][3], top)]
    finally:
        document.close()
    return [OutsideRun(r["page"], r["text"], [round(v, 1) for v in r["box"]]) for r in found]
