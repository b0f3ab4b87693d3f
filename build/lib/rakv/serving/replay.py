"""The reference a served trace is held to: each finished request generated alone by the batch-one engine.

A later turn's prompt is rebuilt as the server built it: the previous turn's prompt, its *served* output, then the
new message (so a difference in one turn is counted once, not carried into the next).
"""

from __future__ import annotations

from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.engine import Engine
from rakv.serving.trace import TraceRequest


def outputs_alone(engine: Engine, trace: list[TraceRequest], served: dict[str, list[int]], *,
                  ignore_eos: bool) -> dict[str, list[int]]:
    """Greedy AR output of every request in `served` (id -> served token ids), each alone through an empty store."""
    alone = Engine(engine.pair, PrefixKVStore(budget_bytes=1), proposer=engine.proposer, salt=engine.salt)
    contexts, reference = {}, {}
    for request in trace:
        ids = (contexts.get(request.conversation, []) if request.follows else []) + alone.encode(request.prompt)
        if request.id not in served:
            continue
        reference[request.id] = alone.run(ids, Action(False, 0), request.max_new_tokens,
                                          ignore_eos=ignore_eos).token_ids
        if request.conversation is not None:
            contexts[request.conversation] = ids + served[request.id]
    return reference
