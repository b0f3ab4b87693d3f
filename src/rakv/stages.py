"""Shared wrapper of the Hydra entry points in scripts/: one-line errors, non-zero exit, no traceback."""

from __future__ import annotations

import sys

from rakv.errors import RakvError


def run_stage(name: str, body, cfg) -> None:
    try:
        body(cfg)
    except RakvError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{name}: interrupted; rerun the same command to resume", file=sys.stderr, flush=True)
        sys.exit(130)
