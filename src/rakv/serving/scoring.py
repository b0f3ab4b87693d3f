"""Log-probabilities of a token sequence under the target model: what `echo` and `logprobs` answer on completions.

One forward of the target over the whole sequence on a fresh cache (rakv.runtime.decoding.forward with every
position's logits kept), then an fp32 log-softmax: position i's log-probability is that of token i given tokens
0..i-1 (none for the first token, which nothing predicts), with the `top` most likely tokens there. The forward is
the target's own (the engine's kernels), run on the engine thread (rakv.serving.engine_loop), its one owner. A
generated token's log-probability is the raw model's (before temperature and top-p), as vLLM answers by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rakv.runtime.decoding import forward
from rakv.runtime.kernels import new_kv_cache

MAX_LOGPROBS = 20  # top alternatives per position at most (vLLM's default --max-logprobs)
CHUNK = 256  # positions per forward: the logits held at once (rows x vocabulary, fp32)


@dataclass(frozen=True)
class Scored:
    """Per position of the sequence: its token's log-probability (None at 0) and the top alternatives there, as
    (token id, log-probability), most likely first (None at 0; empty when none were asked)."""

    logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None]


@torch.inference_mode()
def score(model: torch.nn.Module, ids: list[int], top: int, device: torch.device | str = "cpu") -> Scored:
    """`ids` scored by `model` (fp32 log-softmax over one forward, run in chunks of CHUNK positions on one cache so
    that no more than CHUNK rows of logits are held at once), with the `top` alternatives at each position."""
    assert ids and 0 <= top <= MAX_LOGPROBS, "score: a non-empty sequence and 0..MAX_LOGPROBS alternatives"
    tokens = torch.tensor(ids, dtype=torch.long, device=device)
    cache = new_kv_cache(model)
    chosen: list[float] = []
    alternatives: list[list[tuple[int, float]] | None] = [None]
    for start in range(0, len(ids) - 1, CHUNK):  # rows start.. predict tokens start+1..
        end = min(start + CHUNK, len(ids) - 1)
        logits = forward(model, tokens[start:end].unsqueeze(0), cache, keep=0)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chosen += logprobs.gather(1, tokens[start + 1:end + 1].unsqueeze(1)).squeeze(1).tolist()
        if top:
            values, indices = logprobs.topk(top, dim=-1)
            alternatives += [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        else:
            alternatives += [[] for _ in range(end - start)]
    return Scored([None, *chosen], alternatives)
