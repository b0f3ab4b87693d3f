"""What a reader of the built paper meets that the sources do not show: from LaTeX's log each overfull line and
each float too large for the page; from the PDF every character outside the margins main.tex sets (pypdfium2), the
smallest effective type on every page and each float's page against its first reference's (pypdf);
paper/build/<name>/layout.json keeps it beside the PDF (`PdfLayout`, tests/test_paper_text.py).
"""

from __future__ import annotations

import json
import math
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


MIN_TYPE_PT = 7.0  # the smallest effective type a page may print (issue 60: "no page under 7 pt")
MAX_FLOAT_DISTANCE = 2  # the most pages a float may stand from its first reference
SHORTEST_RUN = 2  # characters: a shorter run (a sub- or superscript in a formula) is not read as type
MIN_PAGE_FILL = 1 / 3  # the least share of the text area's height a page fills, unless it ends a section


@dataclass(frozen=True)
class PageFill:
    """A page (from 1): the share of the text area's height its text and pictures span (`page_fill`), and whether
    it ends a section (the next page starts with a heading of the outline, or it is the last page)."""
    page: int
    fill: float
    ends_section: bool


@dataclass(frozen=True)
class FloatPlacement:
    """A float (hyperref's destination: table.N, figure.N), the page it prints on and the page of its first
    reference (None: never referenced by a link), pages from 1."""
    name: str
    page: int
    first_reference: int | None

    def distance(self) -> int | None:
        return None if self.first_reference is None else abs(self.page - self.first_reference)


@dataclass(frozen=True)
class PdfLayout:
    """layout.json: each overfull line's excess width and each float too large for the page (pt, from LaTeX's log)
    and, when the PDF was read, every run of characters outside the text area."""
    overfull_hbox_pt: list[float]
    float_too_large_pt: list[float]
    words_outside: list[OutsideRun] = optional()  # absent: the report was made from the log alone
    smallest_type_pt: list[float] = optional()  # per page (from 1); 0.0 on a page without text
    floats: list[FloatPlacement] = optional()
    page_fill: list[PageFill] = optional()

    def sparse_pages(self, minimum: float = MIN_PAGE_FILL) -> list[PageFill]:
        """The pages under `minimum` full that do not end a section."""
        return [p for p in self.page_fill or [] if p.fill < minimum and not p.ends_section]


def layout_report(log: str, pdf: Path | None = None) -> PdfLayout:
    """What runs outside the text area: LaTeX's log (each overfull line's excess width and each float too large
    for the page, pt) and, given the built `pdf`, every character drawn outside it (`words_outside`), each page's
    smallest type (`smallest_type`), where each float stands from its first reference (`float_placements`) and
    how full each page is (`page_fill`)."""
    overfull = [float(x) for x in re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)]
    too_large = [float(x) for x in re.findall(r"Float too large for page by ([\d.]+)pt", log)]
    if pdf is None:
        return PdfLayout(overfull, too_large)
    return PdfLayout(overfull, too_large, words_outside(pdf), smallest_type(pdf), float_placements(pdf),
                     page_fill(pdf))


def _times(a: list[float], b: list[float]) -> list[float]:
    """The product of two PDF matrices [a b c d e f]."""
    return [a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2],
            a[2] * b[1] + a[3] * b[3], a[4] * b[0] + a[5] * b[2] + b[4], a[4] * b[1] + a[5] * b[3] + b[5]]


def smallest_type(pdf: Path, shortest_run: int = SHORTEST_RUN) -> list[float]:
    """Each page's smallest effective type size (pt): a text run's font size times the scale of its text matrix
    and of the transformation in force (a table shrunk by \\adjustbox prints its 8 pt type smaller), over the runs of
    at least `shortest_run` characters; 0.0 for a page without text."""
    from pypdf import PdfReader

    sizes = []
    for page in PdfReader(str(pdf)).pages:
        found: list[float] = []

        def visit(text, cm, tm, font, size, found=found):
            if len(text.strip()) < shortest_run or not size:
                return
            m = _times(list(tm), list(cm))
            found.append(float(size) * math.sqrt(abs(m[0] * m[3] - m[1] * m[2])))

        page.extract_text(visitor_text=visit)
        sizes.append(round(min(found), 2) if found else 0.0)
    return sizes


def float_placements(pdf: Path) -> list[FloatPlacement]:
    """Every float of the PDF (hyperref's named destinations table.N and figure.N) with its page and the page of
    the first link that points at it."""
    from pypdf import PdfReader

    reader = PdfReader(str(pdf))
    pages = {}
    for name, destination in reader.named_destinations.items():
        if re.fullmatch(r"(table|figure)\.\d+", str(name)):
            pages[str(name)] = reader.get_destination_page_number(destination) + 1
    first: dict[str, int] = {}
    for number, page in enumerate(reader.pages, start=1):
        for annotation in page.get("/Annots") or []:
            annotation = annotation.get_object()
            action = annotation.get("/A")
            target = action.get_object().get("/D") if action is not None else annotation.get("/Dest")
            if isinstance(target, str) and target in pages:
                first.setdefault(target, number)
    key = lambda name: (name.split(".")[0], int(name.split(".")[1]))  # noqa: E731
    return [FloatPlacement(name, pages[name], first.get(name)) for name in sorted(pages, key=key)]


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


def page_fill(pdf: Path, margin_pt: float | None = None, heading_pt: float = 12.0) -> list[PageFill]:
    """Each page's fill: the vertical extent of its characters (pypdfium2's boxes; the page number in the footer
    left out) and of its pictures (image and form objects: the figures), clipped to the text area (the page less
    `margin_pt` on each side), over the text area's height; and whether the page ends a section: the last page, or
    the next page has an outline entry (a section or subsection heading) within `heading_pt` of its text area's
    top."""
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    margin = text_margin_pt() if margin_pt is None else margin_pt
    document = pdfium.PdfDocument(str(pdf))
    try:
        starts = set()  # pages (from 0) that start with a heading
        for entry in document.get_toc():
            destination = entry.get_dest()
            if destination is None:
                continue
            index, (_, position) = destination.get_index(), destination.get_view()
            height = document[index].get_size()[1]
            if position and position[1] >= height - margin - heading_pt:
                starts.add(index)
        fills = []
        for number in range(len(document)):
            page = document[number]
            width, height = page.get_size()
            low, high = height - margin, margin
            text = page.get_textpage()
            for i in range(text.count_chars()):
                char = text.get_text_range(i, 1)
                if not char.strip():
                    continue
                left, bottom, right, top = text.get_charbox(i)
                if top < margin - 10 and char.isdigit() and abs((left + right) / 2 - width / 2) < 20:
                    continue  # the page number
                low, high = min(low, bottom), max(high, top)
            for picture in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE, pdfium_c.FPDF_PAGEOBJ_FORM],
                                            max_depth=1):
                _, bottom, _, top = picture.get_bounds()
                low, high = min(low, bottom), max(high, top)
            low, high = max(low, margin), min(high, height - margin)
            extent = max(high - low, 0.0) / (height - 2 * margin)
            fills.append(PageFill(number + 1, round(extent, 3),
                                  number == len(document) - 1 or (number + 1) in starts))
    finally:
        document.close()
    return fills
