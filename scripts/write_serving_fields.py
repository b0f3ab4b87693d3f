"""docs/serving.md's table of the request fields `rakv serve --http` honours, written from the pydantic models
(rakv.serving.protocol.honoured_fields) between its `<!-- honoured-fields -->` markers:
    .venv/bin/python scripts/write_serving_fields.py        (tests/test_http_fields.py fails when it is stale)"""

import sys
from pathlib import Path

from rakv.serving.protocol import honoured_fields

DOC = Path(__file__).resolve().parents[1] / "docs" / "serving.md"
START, END = "<!-- honoured-fields -->", "<!-- /honoured-fields -->"


def rendered(text: str) -> str:
    """`text` (docs/serving.md) with the table between the markers written anew."""
    if START not in text or END not in text:
        sys.exit(f"write_serving_fields: {DOC} lacks the markers {START} ... {END}")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{honoured_fields()}\n{END}{tail}"


if __name__ == "__main__":
    DOC.write_text(rendered(DOC.read_text()))
    print(f"write_serving_fields: {DOC} written")
