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


@dataclass(frozen=True)
class Scored:
    """Per position of the sequence: its token's log-probability (None at 0) and the top alternatives there, as
    (token id, log-probability), most likely first (None at 0; empty when none were asked)."""

    logprobs: list[float | None]
    top: list[list[tuple[int, float]] | None]


@torch.inference_mode()
def score(model: torch.nn.Module, ids: list[int], top: int, device: torch.device | str = "cpu") -> Scored:
    """`ids` scored by `model` (fp32 log-softmax over one forward), with the `top` alternatives at each position."""
    assert ids and 0 <= top <= MAX_LOGPROBS, "score: a non-empty sequence and 0..MAX_LOGPROBS alternatives"
    tokens = torch.tensor(ids, dtype=torch.long, device=device)
    logits = forward(model, tokens.unsqueeze(0), new_kv_cache(model), keep=0)[:-1]  # rows predicting 1..n-1
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, tokens[1:].unsqueeze(1)).squeeze(1).tolist()
    alternatives: list[list[tuple[int, float]] | None] = [None]
    if top:
        values, indices = logprobs.topk(top, dim=-1)
        alternatives += [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
    else:
        alternatives += [[] for _ in chosen]
    return Scored([None, *chosen], alternatives)
