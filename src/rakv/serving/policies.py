"""Speculation policies under load: how many candidates each decoding request may propose this iteration.

Sibling policies with one interface, so that the field's rules and ours are compared like with like
(README: "Serving"). Each caps a request's own depth (`ServedRequest.max_k`: its strategy's k, or a per-round
depth's largest), never raises it, so a request that does not speculate never gets a proposer:

- `per-request`: the request's own k whatever the load (the batch-one behaviour; the default);
- `disable-by-batch-size:B`: vLLM's `speculative_config.disable_by_batch_size`: no speculation once B or more
  requests are decoding;
- `k-by-batch:1=4,4=2,8=0`: a hand-set table of k by the number of decoding requests (the largest entry whose
  batch size is <= the current one applies), as vLLM's dynamic speculation tables.

The scheduler then trims the k it is given to the token budget and the K/V room.
"""

from __future__ import annotations

from dataclasses import dataclass

from rakv.runtime.errors import RakvError
from rakv.serving.request import ServedRequest


@dataclass(frozen=True)
class PerRequest:
    name: str = "per-request"

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        return [r.max_k for r in decoding]


@dataclass(frozen=True)
class DisableByBatchSize:
    batch_size: int
    name: str = "disable-by-batch-size"

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        return [0 if len(decoding) >= self.batch_size else r.max_k for r in decoding]


@dataclass(frozen=True)
class KByBatch:
    table: tuple[tuple[int, int], ...]  # (batch size from which it applies, k), sorted by batch size
    name: str = "k-by-batch"

    def depths(self, decoding: list[ServedRequest]) -> list[int]:
        k = next((k for size, k in reversed(self.table) if size <= len(decoding)), self.table[0][1])
        return [min(k, r.max_k) for r in decoding]


def speculation_policy(text: str):
    """`per-request`, `disable-by-batch-size:B` or `k-by-batch:SIZE=K,...`; a one-line error otherwise."""
    name, _, arg = text.partition(":")
    try:
        if name == "per-request" and not arg:
            return PerRequest()
        if name == "disable-by-batch-size":
            size = int(arg)
            if size >= 1:
                return DisableByBatchSize(size)
        if name == "k-by-batch":
            table = tuple(sorted((int(a), int(b)) for a, b in (item.split("=") for item in arg.split(","))))
            if table and all(size >= 1 and k >= 0 for size, k in table):
                return KByBatch(table)
    except ValueError:
        pass
    raise RakvError(f"--speculation takes per-request, disable-by-batch-size:B (B >= 1) or k-by-batch:SIZE=K,... "
                    f"(e.g. k-by-batch:1=4,4=2,8=0), got '{text}'")
