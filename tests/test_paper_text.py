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
    floats = re.findall(r"\\begin\{(table|figure)\}(.*?)\\end\{\1\}", source, re.S)
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
