"""The reference a served trace is held to: each finished request generated alone by the batch-one engine.

A later turn's prompt is rebuilt as the server built it: the previous turn's prompt, its *served* output, then the
new message (so a difference in one turn is counted once, not carried into the next).
"""

from __future__ import annotations

from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.engine import Engine
from rakv.serving.trace import TraceRequest


def outputs_alone(engine: Engine, trace: list[TraceRequest], served: dict[str, list[int]] | None, *,
                  ignore_eos: bool, memo: dict | None = None) -> dict[str, list[int]]:
    """Greedy AR output of every request in `served` (id -> served token ids), each alone through an empty store.
    `served` None: every request, a later turn's prompt built from the reference's own outputs (the trace's
    batch-one AR reference); `memo` (prompt ids, max_new_tokens) -> output is shared between calls."""
    alone = Engine(engine.pair, PrefixKVStore(budget_bytes=1), proposer=engine.proposer, salt=engine.salt)
    memo = {} if memo is None else memo
    contexts, reference = {}, {}
    for request in trace:
        ids = (contexts.get(request.conversation, []) if request.follows else []) + alone.encode(request.prompt)
        if served is not None and request.id not in served:
            continue
        key = (tuple(ids), request.max_new_tokens, ignore_eos)
        if key not in memo:
            memo[key] = alone.run(ids, Action(False, 0), request.max_new_tokens, ignore_eos=ignore_eos).token_ids
        reference[request.id] = memo[key]
        if request.conversation is not None:
            contexts[request.conversation] = ids + (served if served is not None else reference)[request.id]
    return reference


def lookup_rounds(proposer, prompt: list[int], output: list[int], k: int) -> tuple[list[tuple[int, int]], int]:
    """The rounds greedy speculation with a model-free proposer (prompt lookup) makes at depth k over a known
    greedy output: (proposed, accepted) per round with candidates, and the rounds without. Greedy verification
    accepts a candidate exactly when it is the output's next token, so the output alone determines them."""
    log, empty, t = [], 0, 1  # the first token comes from the prefill
    while t < len(output):
        depth = min(k, len(output) - t - 1)
        candidates = proposer.propose(prompt + output[:t], depth, None, None)[0] if depth > 0 else []
        accepted = 0
        while accepted < len(candidates) and candidates[accepted] == output[t + accepted]:
            accepted += 1
        if candidates:
            log.append((len(candidates), accepted))
        else:
            empty += 1
        t += accepted + 1
    return log, empty
