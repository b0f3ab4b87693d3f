"""docs/engine.md's "Precision" tables, written from the shipped precision benchmarks
(data/reference/peer/bench_engine/precision-<cpu>.json, written by `scripts/bench_engine.py --precision-peer`;
rakv.bench.engine_report.PrecisionPeerFile) between its `<!-- precision-table -->` markers:
    .venv/bin/python scripts/write_precision_table.py        (tests/test_precision.py fails when it is stale)"""

import sys
from pathlib import Path

from rakv.bench.engine_report import PrecisionPeerFile, precision_markdown
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import read_record
from rakv.runtime.paths import ROOT
from rakv.runtime.run_layout import PeerLayout

DOC = ROOT / "docs" / "engine.md"
START, END = "<!-- precision-table -->", "<!-- /precision-table -->"


def block(files: list[Path]) -> str:
    """The markdown of every shipped precision benchmark in `files`, or the sentence that none is shipped."""
    if not files:
        return ("No precision benchmark is shipped yet: `scripts/bench_engine.py --precision-peer` writes one to "
                "`data/reference/peer/bench_engine/precision-<cpu>.json`, and this script renders it here.")
    return "\n\n".join(precision_markdown(read_record(PrecisionPeerFile, path), path.relative_to(ROOT).as_posix()
                                          if path.is_relative_to(ROOT) else str(path)) for path in files)


def rendered(text: str, files: list[Path]) -> str:
    """`text` (docs/engine.md) with the block between the markers written anew from `files`."""
    if text.count(START) != 1 or text.count(END) != 1:
        raise RakvError(f"{DOC} needs one {START} ... {END} pair")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{block(files)}\n{END}{tail}"


def main() -> int:
    try:
        DOC.write_text(rendered(DOC.read_text(), PeerLayout.shipped().precisions()))
    except RakvError as exc:
        print(f"write_precision_table: error: {exc}", file=sys.stderr)
        return 2
    print(f"write_precision_table: {DOC} written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
