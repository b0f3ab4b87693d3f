"""The built paper read as a reviewer reads it: its text (pypdf) holds no placeholder, no mis-encoded character, no
raw key name and no unresolved reference. The shipped PDF is the reference run's (paper/build/offline/main.pdf);
scripts/ship_reference.sh rebuilds it, so a defect in the report's wording fails here before it ships."""

import re

import pytest
from pypdf import PdfReader

from rakv.runtime.paths import PAPER_DIR
from rakv.runtime.run_layout import RunLayout

REFERENCE = RunLayout.reference("offline")
PDF = REFERENCE.pdf


@pytest.fixture(scope="module")
def text() -> str:
    if not PDF.exists():
        pytest.fail(f"{PDF} is missing: scripts/ship_reference.sh builds it")
    return "\n".join(page.extract_text() or "" for page in PdfReader(PDF).pages)


@pytest.mark.parametrize("pattern, what", [
    (r"\bn/a\b", "a placeholder ('n/a')"),
    (r"[¿¡]", "a comparison printed in the wrong font encoding"),
    (r"\?\?", "an unresolved reference"),
    (r"\[\?\]", "an unresolved citation"),
    (r"!=", "a raw '!=' instead of a symbol"),
    (r"(?<![\w.])-0\.0(?![\d.]*[1-9])", "a signed zero"),
    (r"\bk = \d+\.0\b", "a depth printed as a float"),
    (r"\bbest_fixed\b|\bspec_slowdown\b|\bmape_prefix\b", "a raw key name"),
])
def test_the_papers_text_has_no(text, pattern, what):
    found = re.findall(rf".{{0,40}}{pattern}.{{0,40}}", text)
    assert not found, f"{what} in the built paper: {found[:3]}"


def test_the_paper_tells_what_it_substitutes_and_concludes(text):
    flat = " ".join(text.split())
    assert "What this artifact substitutes" in flat and "SmolLM2" in flat and "architecture twins" in flat
    assert "Conclusion" in flat and "Serving under load" in flat


PAPER = PAPER_DIR
LAYOUT = REFERENCE.pdf_layout


def paper_sources() -> str:
    """main.tex and the reference run's generated LaTeX, as LaTeX reads them."""
    generated = sorted(REFERENCE.generated.glob("*.tex"))
    return "\n".join(p.read_text() for p in [PAPER / "main.tex", *generated])


def test_every_table_and_figure_is_labelled_and_referenced():
    source = paper_sources()
    floats = re.findall(r"\\begin\{(rakvtable|table|figure|longtable)\}(.*?)\\end\{\1\}", source, re.S)
    floats = [(kind, body) for kind, body in floats if body.strip() != "\\BODY"]  # main.tex's rakvtable definition
    assert len(floats) >= 20
    for kind, body in floats:
        caption = re.search(r"\\caption\{(.{0,60})", body)
        labels = re.findall(r"\\label\{([^}]*)\}", body)
        assert labels, f"a {kind} without a label: {caption.group(1) if caption else body[:60]!r}"
        for label in labels:
            assert re.search(r"\\ref\{" + re.escape(label) + r"\}", source), f"{label} is never referenced"


def test_no_sentence_of_the_built_paper_is_printed_twice(text):
    flat = " ".join(text.split())
    sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", flat) if len(s) > 80]
    repeated = {s for s in sentences if sentences.count(s) > 1}
    assert not repeated, f"printed twice: {sorted(repeated)[:2]}"


def test_nothing_runs_outside_the_text_area():
    """LaTeX's own account of the shipped build (paper/build/offline/layout.json, written by the paper stage): no
    float taller than the page, no line more than 2 pt wider than the text."""
    from rakv.experiments.pdf_layout import read_pdf_layout

    layout = read_pdf_layout(LAYOUT)
    assert not layout.float_too_large_pt, layout
    assert max(layout.overfull_hbox_pt, default=0.0) <= 2.0, layout.overfull_hbox_pt
    assert layout.words_outside == [], layout.words_outside or "layout.json has no words_outside"


def test_every_character_of_the_built_pdf_lies_inside_the_text_area():
    """The built PDF itself, character by character (pypdfium2's boxes): nothing outside main.tex's margins but the
    page numbers; the same check flags the body text once the area is shrunk (it can fail)."""
    from rakv.experiments.pdf_layout import text_margin_pt, words_outside

    assert words_outside(PDF) == []
    shrunk = words_outside(PDF, margin_pt=text_margin_pt() + 40)
    assert {r.page for r in shrunk} >= {1, 2} and any(len(r.text) > 20 for r in shrunk)


def test_the_layout_report_reads_latexs_warnings():
    from rakv.experiments.pdf_layout import PdfLayout, layout_report

    log = ("Overfull \\hbox (41.03337pt too wide) in paragraph at lines 1--194\n"
           "LaTeX Warning: Float too large for page by 82.42203pt on input line 358.\n"
           "Underfull \\hbox (badness 10000) in paragraph\n")
    assert layout_report(log) == PdfLayout([41.03337], [82.42203])


def test_the_abstract_is_at_most_its_word_limit_and_the_count_can_fail():
    """The shipped abstract (paper/generated/offline/abstract.tex) has at most ABSTRACT_WORDS words, counted as a
    reader counts them; the same count flags an abstract one word too long (positive control)."""
    from rakv.experiments.prose_abstract import ABSTRACT_WORDS, words

    shipped = (REFERENCE.generated / "abstract.tex").read_text()
    assert 100 <= words(shipped) <= ABSTRACT_WORDS, words(shipped)
    assert words("\\texttt{smollm2} 1.0\\% [-3.2\\%, 5.0\\%] $k=0$") == 5
    assert words(" ".join(["word"] * (ABSTRACT_WORDS + 1))) > ABSTRACT_WORDS


def test_the_abstract_tells_the_findings_beside_the_reference_and_what_sets_the_regime():
    """The abstract names the setting's substitutions, the reference's figures and the engine's prices."""
    from rakv.experiments.claims import REFERENCE as FIGURES
    from rakv.experiments.formatting import pct

    flat = " ".join((REFERENCE.generated / "abstract.tex").read_text().split())
    for needed in ("2-core", "SmolLM2-135M", "int8", "prompt lookup", "Joint-k4", "KV-only",
                   pct(FIGURES["latency_reduction_vs_joint_k4"]), "verifying 5 tokens", "earlier engines"):
        assert needed in flat, needed


@pytest.mark.parametrize("triple, word", [((0.1, 0.05, 0.15), "10.0\\% faster"),
                                          ((-0.1, -0.15, -0.05), "10.0\\% slower"),
                                          ((0.01, -0.02, 0.04), "not distinguishable")])
def test_the_abstracts_comparative_words_come_from_the_interval(triple, word):
    from rakv.experiments.prose_abstract import versus

    assert versus(triple).startswith(word), versus(triple)


def crafted_pdf(path, pages: list[tuple[str, list[str]]], destinations: dict[str, int]):
    """A tiny PDF for the layout checks' positive controls: each page a content stream and the named destinations
    its links point at; `destinations`: name -> page index (from 0) it stands on."""
    from pypdf import PdfWriter
    from pypdf.generic import (
        ArrayObject,
        DecodedStreamObject,
        DictionaryObject,
        FloatObject,
        NameObject,
        TextStringObject,
    )

    writer = PdfWriter()
    font = writer._add_object(DictionaryObject({NameObject("/Type"): NameObject("/Font"),
                                               NameObject("/Subtype"): NameObject("/Type1"),
                                               NameObject("/BaseFont"): NameObject("/Helvetica")}))
    for content, links in pages:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
        stream = DecodedStreamObject()
        stream.set_data(content.encode())
        page[NameObject("/Contents")] = writer._add_object(stream)
        if links:
            page[NameObject("/Annots")] = ArrayObject(writer._add_object(DictionaryObject({
                NameObject("/Type"): NameObject("/Annot"), NameObject("/Subtype"): NameObject("/Link"),
                NameObject("/Rect"): ArrayObject([FloatObject(v) for v in (72, 700, 120, 712)]),
                NameObject("/A"): DictionaryObject({NameObject("/S"): NameObject("/GoTo"),
                                                    NameObject("/D"): TextStringObject(name)})})) for name in links)
    for name, index in destinations.items():
        writer.add_named_destination(name, index)
    with open(path, "wb") as out:
        writer.write(out)
    return path


def test_the_type_size_check_reads_a_font_size_through_its_scaling(tmp_path):
    """Positive control: 5 pt type, and 10 pt type shrunk by half (a table under \\adjustbox), both read as 5 pt;
    a one-character run (a subscript) is not type."""
    from rakv.experiments.pdf_layout import smallest_type

    pdf = crafted_pdf(tmp_path / "type.pdf", [
        ("BT /F1 10 Tf 72 720 Td (Body text) Tj ET", []),
        ("BT /F1 5 Tf 72 720 Td (tiny type) Tj ET", []),
        ("q 0.5 0 0 0.5 0 0 cm BT /F1 10 Tf 72 720 Td (shrunk table) Tj ET Q", []),
        ("BT /F1 10 Tf 72 720 Td (Body) Tj /F1 4 Tf (k) Tj ET", [])], {})
    assert smallest_type(pdf) == [10.0, 5.0, 5.0, 10.0]


def test_no_page_of_the_built_paper_prints_type_under_7pt():
    """The paper stage's account of the shipped PDF (layout.json): every page's smallest effective type."""
    from rakv.experiments.pdf_layout import MIN_TYPE_PT, read_pdf_layout

    layout = read_pdf_layout(LAYOUT)
    assert layout.smallest_type_pt, "layout.json has no smallest_type_pt: rebuild the paper stage"
    # to a tenth of a point: a 7 pt superscript reads 6.97 through the matrices' rounding
    small = {page: size for page, size in enumerate(layout.smallest_type_pt, start=1)
             if 0 < round(size, 1) < MIN_TYPE_PT}
    assert not small, f"pages printing type under {MIN_TYPE_PT} pt (page: pt): {small}"


def test_the_float_distance_check_finds_a_float_far_from_its_reference(tmp_path):
    """Positive control: a table on page 4 whose only link stands on page 1 is 3 pages away; a float never linked
    has no distance."""
    from rakv.experiments.pdf_layout import float_placements

    pdf = crafted_pdf(tmp_path / "floats.pdf", [("BT /F1 10 Tf 72 720 Td (see Table 1) Tj ET", ["table.1"]),
                                                 ("BT /F1 10 Tf 72 720 Td (text) Tj ET", ["figure.1"]),
                                                 ("BT /F1 10 Tf 72 720 Td (text) Tj ET", []),
                                                 ("BT /F1 10 Tf 72 720 Td (Table 1) Tj ET", ["table.1"])],
                      {"table.1": 3, "figure.1": 1, "figure.2": 2})
    placed = {f.name: f for f in float_placements(pdf)}
    assert placed["table.1"].distance() == 3 and placed["figure.1"].distance() == 0
    assert placed["figure.2"].first_reference is None and placed["figure.2"].distance() is None


def test_every_float_of_the_built_paper_stands_near_its_first_reference():
    from rakv.experiments.pdf_layout import MAX_FLOAT_DISTANCE, read_pdf_layout

    layout = read_pdf_layout(LAYOUT)
    assert layout.floats, "layout.json has no floats: rebuild the paper stage"
    far = [f for f in layout.floats if f.distance() is None or f.distance() > MAX_FLOAT_DISTANCE]
    assert not far, f"floats more than {MAX_FLOAT_DISTANCE} pages from their first reference: {far}"


def test_a_regime_point_is_labelled_by_what_its_run_measured(tmp_path):
    """Figure fig:regime and its text: where the cost model finds no k that pays, the label says what the run
    measured (read from the points), and the within-run band comes from the run's own calibrations."""
    import pandas as pd

    from rakv.experiments.figures import calibration_band, regime_map
    from rakv.experiments.prose_machines import measured_faster

    points = pd.DataFrame({"machine": ["a", "a", "a", "b"], "pair": ["t-draft", "t-lookup", "twin", "t-draft"],
                           "context": 144.0, "draft_ratio": [0.3, 0.02, 0.5, 0.3],
                           "verify4_ratio": [1.11, 1.47, 1.9, 1.3], "crossover": [0.6, 0.1, 0.8, float("nan")],
                           "crossover_k": [2, 1, 2, None], "measured_alpha": [0.9, 0.5, float("nan"), 0.9],
                           "faster_scenarios": [40, 40, None, 27], "scenarios": [40, 40, None, 40]})
    assert calibration_band(points) == (1.11, 1.47)  # the twin (not run by the study) is outside the band
    assert calibration_band(points[points.pair != "t-lookup"]) is None  # control: one calibration, no band
    row = next(points[points.machine == "b"].itertuples())
    assert measured_faster(row) == (", yet that run measured the best $k>0$ faster than the best $k=0$ in 27 of 40 "
                                    "scenarios")
    assert measured_faster(next(points[points.pair == "twin"].itertuples())) == ""  # control: not measured
    assert regime_map(points, tmp_path)[0].exists()


@pytest.mark.heavy
def test_the_machines_table_carries_the_measured_regime_and_the_band():
    """Table tab:machines, from the shipped runs: each pair's measured count of scenarios where the best k>0 won
    equals its summary's, and the band's ends are this run's two calibrations."""
    from rakv.experiments import analysis
    from rakv.experiments.prose_machines import across_machines, calibration_band

    results = REFERENCE.root
    text = across_machines(results)
    points = analysis.regime_points(analysis.regime_folders(results))
    low, high = calibration_band(results)
    assert f"{low:.2f}--{high:.2f}" in text
    for p in points.dropna(subset=["faster_scenarios"]).itertuples():
        assert f"{int(p.faster_scenarios)}/{int(p.scenarios)}" in text


def test_the_page_fill_check_finds_a_near_empty_page_and_exempts_a_sections_last(tmp_path):
    """Positive control: a page with one line at its top is under a third full and flagged; the same page before
    a page whose outline entry (a heading) stands at the text area's top ends a section and is exempt, as is the
    last page; a page with text at its top and its bottom is full."""
    from pypdf import PdfWriter
    from pypdf.generic import Fit

    from rakv.experiments.pdf_layout import PdfLayout, page_fill, text_margin_pt

    line = "BT /F1 10 Tf 72 720 Td (one line at the top) Tj ET"
    plain = crafted_pdf(tmp_path / "plain.pdf", [(line + " BT /F1 10 Tf 72 80 Td (and one at the bottom) Tj ET", []),
                                                 (line, []), (line, []), (line, [])], {})
    writer = PdfWriter(clone_from=plain)
    writer.add_outline_item("A heading", 3, fit=Fit.xyz(left=72, top=792 - text_margin_pt(), zoom=0))
    headed = tmp_path / "headed.pdf"
    writer.write(headed)
    fills = page_fill(plain)
    assert fills[0].fill > 0.9 and fills[1].fill < 0.1
    assert [p.page for p in PdfLayout([], [], page_fill=fills).sparse_pages()] == [2, 3]
    assert [p.ends_section for p in page_fill(headed)] == [False, False, True, True]
    assert [p.page for p in PdfLayout([], [], page_fill=page_fill(headed)).sparse_pages()] == [2]


def test_no_page_of_the_built_paper_is_under_a_third_full_unless_it_ends_a_section():
    from rakv.experiments.pdf_layout import MIN_PAGE_FILL, read_pdf_layout

    layout = read_pdf_layout(LAYOUT)
    assert layout.page_fill, "layout.json has no page_fill: rebuild the paper stage"
    assert any(p.ends_section for p in layout.page_fill[:-1])  # the outline's headings were found
    sparse = [(p.page, p.fill) for p in layout.sparse_pages()]
    assert not sparse, f"pages under {MIN_PAGE_FILL:.2f} full that end no section (page, fill): {sparse}"


def test_the_sampling_findings_count_the_verdicts_of_the_intervals():
    """The sampling section's summary sentences (the cells are in the appendix's tables): each count follows the
    side of 1 each latency ratio's CI lies on; control: moving one interval moves one count."""
    from types import SimpleNamespace as Row

    from rakv.experiments.prose_sampling import long_context_sentence, temperature_sentence
    from rakv.runtime.actions import ADAPTIVE, KV_ONLY

    fast, even, slow = (0.7, 0.6, 0.8), (1.0, 0.9, 1.1), (1.3, 1.2, 1.4)
    rows = [Row(configuration="a", temperature=0.0, spec_k4_vs_ar=fast, vs_ar=fast, vs_best_fixed=even),
            Row(configuration="b", temperature=1.0, spec_k4_vs_ar=slow, vs_ar=even, vs_best_fixed=even)]
    text = temperature_sentence(rows)
    assert "spec-k4 is faster than AR in 1 and slower in 1" in text and "faster than AR in 1 and slower in 0" in text
    assert text.endswith("not faster than AR in: b at $T=1$.")
    rows[1].spec_k4_vs_ar = fast  # control
    assert "spec-k4 is faster than AR in 2 and slower in 0" in temperature_sentence(rows)
    assert temperature_sentence(rows).endswith("not faster than AR in: none.")
    cells = [Row(configuration="a", budget_mib=512.0, length_bin="1024-2048", strategy=KV_ONLY, vs_ar=fast),
             Row(configuration="a", budget_mib=512.0, length_bin="1024-2048", strategy=ADAPTIVE, vs_reuse=slow)]
    text = long_context_sentence(cells)
    assert "1 cells" in text and "faster than AR in 1, not distinguishable in 0 and slower in 0" in text
    assert "faster than kv-only in 0, not distinguishable in 0 and slower in 1" in text
    cells[1].vs_reuse = even  # control
    assert "faster than kv-only in 0, not distinguishable in 1 and slower in 0" in long_context_sentence(cells)
    assert long_context_sentence(cells[:1]) == ""  # no speculation on top of reuse: no sentence


def test_the_machines_finding_reads_the_extremes_of_the_comparisons():
    from rakv.experiments.prose_machines import MachineComparison, machine_pairs_sentence

    pairs = [MachineComparison("x", "y", 50, 40, "other kernels", ["s"] * 9, []),
             MachineComparison("x", "z", 54, 53, "same kernels", [], [])]
    text = machine_pairs_sentence(pairs)
    assert "at most 9 of 50" in text and "at least 40 of 50" in text and "1 of the 2 compare runs of other" in text
    pairs[1].significant = ["s"] * 20  # control: the other pair now differs most
    assert "at most 20 of 54" in machine_pairs_sentence(pairs)
    assert machine_pairs_sentence([]) == ""


def test_the_serving_findings_count_the_comparisons_by_their_intervals():
    """The serving section's per-family sentence, from the shipped summary: the counts of lowered, raised and
    unchanged follow each comparison's CI; control: a comparison whose CI is moved above zero counts as raised."""
    import dataclasses

    from rakv.experiments.prose_serving import serving_text
    from rakv.experiments.summary import read_summary

    summary = read_summary(REFERENCE.root)
    rows = [r for r in summary.serving.comparisons if r.family == "speculation"]
    assert rows, "the shipped run has no speculation comparisons to count"
    lowered = sum(r.ci[2] is not None and r.ci[2] < 0 for r in rows)
    raised = sum(r.ci[1] is not None and r.ci[1] > 0 for r in rows)
    expected = (f"of {len(rows)} comparisons of a policy against its baseline (goodput), {lowered} lowered the "
                f"metric, {raised} raised it and {len(rows) - lowered - raised} did not measurably change it")
    assert expected in serving_text(summary)
    flat = next(r for r in rows if not (r.ci[1] > 0 or r.ci[2] < 0))
    moved = [dataclasses.replace(r, ci=[0.2, 0.1, 0.3]) if r is flat else r for r in summary.serving.comparisons]
    changed = dataclasses.replace(summary, serving=dataclasses.replace(summary.serving, comparisons=moved))
    assert (f"{lowered} lowered the metric, {raised + 1} raised it and {len(rows) - lowered - raised - 1} did not"
            in serving_text(changed))
