"""The built paper read as a reviewer reads it: its text (pypdf) holds no placeholder, no mis-encoded character, no
raw key name and no unresolved reference. The shipped PDF is the reference run's (paper/build/offline/main.pdf);
scripts/ship_reference.sh rebuilds it, so a defect in the report's wording fails here before it ships."""

import re
from pathlib import Path

import pytest
from pypdf import PdfReader

PDF = Path(__file__).resolve().parents[1] / "paper" / "build" / "offline" / "main.pdf"


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
