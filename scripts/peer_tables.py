"""docs/peers.md's tables rendered from the shipped peer results (data/reference/peer/, scripts/ship_peer.sh):
rewrites each block between `<!-- peer-table: NAME -->` and `<!-- /peer-table: NAME -->`.

    .venv/bin/python scripts/peer_tables.py [--check] [--folder data/reference/peer] [--doc docs/peers.md]

--check: change nothing, exit 1 when a block differs from its rendering (tests/test_peer_tables.py runs the same).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rakv.experiments.peer_tables import refresh, render_blocks
from rakv.runtime.paths import ROOT
from rakv.runtime.run_layout import PeerLayout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=PeerLayout.shipped().root)
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "peers.md")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    try:
        text = args.doc.read_text()
        rendered = refresh(text, render_blocks(args.folder))
    except (OSError, ValueError, KeyError) as exc:
        print(f"peer_tables: error: {exc}", file=sys.stderr)
        return 2
    if rendered == text:
        print(f"peer_tables: {args.doc} is current")
        return 0
    if args.check:
        print(f"peer_tables: {args.doc} differs from the shipped data; run scripts/peer_tables.py", file=sys.stderr)
        return 1
    args.doc.write_text(rendered)
    print(f"peer_tables: {args.doc} rewritten from {args.folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
