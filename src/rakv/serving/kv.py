"""The one owner of serving's K/V: every running request's caches (the target's and its proposer's) and the prefix
store's entries, with the byte account the scheduler budgets with.

    hit(request)            query: what the store would give the request now (no copy, nothing changes)
    request_bytes(r, rows)  query: K/V bytes the request holds with `rows` more positions (target + draft per position)
    allocate(request)       a slot at admission: a cache holding the store's hit (copied in), a proposer, a sampler
    slot(request)           the running request's slot (the executor appends to and rolls back its caches)
    free(request)           drop its K/V (preempted: recomputed later; refused: nothing to keep)
    publish(request)        its prompt just computed: the prompt's K/V into the store now (shared while it decodes)
    commit(request, acc)    at completion: insert prompt and prompt + output into the store, then free

Store entries are copied in and out, never shared: a hit is copied into a fresh growing cache (one copy per hit,
the batch-one engine's `kv_copy_s`), and an insert copies the request's positions (rakv.runtime.cache). With the
draft configuration an entry also carries the draft model's K/V (rakv.runtime.cache.DraftPart, under the draft's
identity), so a speculating request's draft starts from the store's positions as its target does. The store
keeps its own byte budget (conf/cache: `budget_mib`, LRU eviction); the running requests' budget is the scheduler's
`kv_budget_bytes`, counted here. The slot's proposer holds the draft model's cache; the request's per-round depth
travels with its choice (rakv.serving.request). With several proposers (rakv-asd choosing per request, `proposers`)
each request's slot holds a proposer of its own kind, and only a draft-model request holds the draft's K/V.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rakv.runtime.cache import Hit
from rakv.runtime.decoding import cache_nbytes, forward
from rakv.runtime.engine import Engine
from rakv.runtime.kernels import new_kv_cache
from rakv.runtime.proposers import Proposer, proposer_type
from rakv.serving.request import ServedRequest, Status


@dataclass
class Slot:
    """The tensor side of a running request."""

    cache: object  # the target's K/V (rakv.runtime.kernels.new_kv_cache)
    proposer: Proposer | None  # its own proposer (a draft model's cache, or prompt lookup)
    generator: torch.Generator | None  # its sampler's stream (None: greedy)
    drafting: bool = False  # the proposer has been reset (or resumed from the store) for this run of the request
    draft_hit_tokens: int = 0  # positions of the draft's K/V that came from the store at admission
    stored_logits: torch.Tensor | None = None  # an exact repeat's next-token logits: its first token needs no forward
    prompt_logits: torch.Tensor | None = None  # the logits after its prompt (what an exact repeat skips to)
    last_logits: torch.Tensor | None = None  # the logits that produced its latest token (for the store insert)


@dataclass
class KVManager:
    engine: Engine
    proposers: tuple[str, ...] = ()  # several proposers served together (rakv-asd chooses per request); () for one

    def __post_init__(self):
        pair = self.engine.pair
        self.slots: dict[str, Slot] = {}
        self.kept_prompt_logits: dict[str, torch.Tensor] = {}  # a preempted request's: its prompt entry at completion
        self.target_bpt = _bytes_per_token(pair.target.module, pair.device)
        drafted = any(proposer_type(name).has_draft_model for name in (self.engine.proposer, *self.proposers))
        self.draft_bpt = _bytes_per_token(pair.draft.module, pair.device) if drafted else 0

    # --- queries ---

    def kind(self, request: ServedRequest) -> type[Proposer]:
        """The kind of proposer the request runs with: its choice's, of several; else the engine's."""
        return proposer_type(request.proposer) if request.proposer else self.engine.proposer_type

    def bytes_per_token(self, request: ServedRequest) -> int:
        """K/V bytes one position of this request holds: the target's, and its draft model's if it speculates."""
        return self.target_bpt + (self.draft_bpt if request.max_k and self.kind(request).has_draft_model else 0)

    def request_bytes(self, request: ServedRequest, rows: int = 0) -> int:
        return (request.computed + rows) * self.bytes_per_token(request)

    def lookup_ids(self, request: ServedRequest) -> np.ndarray:
        """What the store is asked: the prompt at first; after a preemption, every token but the last."""
        tokens = request.tokens if not request.state.tokens else request.tokens[:-1]
        return np.asarray(tokens, dtype=np.int64)

    def hit(self, request: ServedRequest) -> Hit:
        engine = self.engine
        return engine.store.peek(engine.namespace(request.salt), self.lookup_ids(request), engine.draft_key)

    def slot(self, request: ServedRequest) -> Slot:
        return self.slots[request.id]

    # --- changes ---

    def allocate(self, request: ServedRequest) -> Slot:
        """Admission's K/V: a cache holding the `request.computed` positions its hit gives (the scheduler counted them),
        a proposer when it may speculate (its draft's K/V from the same entry when the entry has it)."""
        engine, reused, kind = self.engine, request.computed, self.kind(request)
        # the store's draft K/V is the engine's own draft's: a request of another kind takes none
        own_draft = engine.draft_key if request.max_k and kind is engine.proposer_type else None
        kv, stored_logits, draft_kv = None, None, None
        if reused:
            hit, kv, stored_logits, draft_kv = engine.store.lookup(
                engine.namespace(request.salt), self.lookup_ids(request), own_draft)
            assert hit.reused_tokens == reused, f"request {request.id}: the store changed between peek and lookup"
        generator = None
        if not request.sampling.greedy:
            generator = torch.Generator(device=engine.pair.device).manual_seed(request.sampling.seed)
        proposer = kind.for_pair(engine.pair) if request.max_k else None
        slot = Slot(new_kv_cache(engine.pair.target.module, kv), proposer, generator)
        if draft_kv is not None:  # the draft starts from the store's positions too; its first round feeds the rest
            proposer.resume(request.tokens, draft_kv)
            slot.drafting, slot.draft_hit_tokens = True, reused
        slot.stored_logits = stored_logits if not request.state.tokens else None
        slot.prompt_logits = self.kept_prompt_logits.pop(request.id, None)  # recomputed after a preemption
        self.slots[request.id] = slot
        return slot

    def free(self, request: ServedRequest) -> None:
        """Drop its K/V; a preempted request's prompt logits are kept (a recompute does not produce them again), so
        its prompt is still stored when it completes; an aborted request's go too."""
        slot = self.slots.pop(request.id, None)
        if request.status in (Status.ABORTED, Status.FAILED):
            self.kept_prompt_logits.pop(request.id, None)
        elif slot is not None and slot.prompt_logits is not None and not request.state.finished:
            self.kept_prompt_logits[request.id] = slot.prompt_logits

    def publish(self, request: ServedRequest) -> None:
        """The prompt's K/V into the store as soon as it is computed (its first token out), so that requests sharing
        its prefix that arrive while it decodes reuse it, as vLLM shares a block as soon as it is computed. Without
        acceptance yet and without the draft's K/V (the draft has not run): `commit` adds both to the same entry
        at completion. An exact repeat's prompt is in the store already."""
        slot = self.slots[request.id]
        if slot.prompt_logits is None or request.hit_tokens == len(request.prompt):
            return
        layers = [(layer.keys, layer.values) for layer in slot.cache.layers]
        self.engine.store.insert(self.engine.namespace(request.salt), np.asarray(request.prompt, dtype=np.int64),
                                 layers, slot.prompt_logits)

    def commit(self, request: ServedRequest, acceptance: tuple[float, float] | None) -> None:
        """Insert the prompt and the prompt + output (all but the last token, whose K/V is never computed) into the
        store, so a repeat is an exact hit and a conversation's next turn an exact-prefix hit; then free."""
        slot = self.slots.pop(request.id)
        self.kept_prompt_logits.pop(request.id, None)
        store, ns = self.engine.store, self.engine.namespace(request.salt)
        layers = [(layer.keys, layer.values) for layer in slot.cache.layers]
        held = slot.cache.get_seq_length()
        exact_repeat = request.hit_tokens == len(request.prompt)
        draft = self.engine.draft_part(slot.proposer, request.prompt)
        if (slot.prompt_logits is not None and held >= len(request.prompt)
                # (an exact repeat: its draft)
                and (not exact_repeat or (draft is not None and not slot.draft_hit_tokens))):
            store.insert(ns, np.asarray(request.prompt, dtype=np.int64), layers, slot.prompt_logits, acceptance,
                         draft)
        extended = request.tokens[:-1]
        if len(extended) > len(request.prompt) and slot.last_logits is not None and held >= len(extended):
            store.insert(ns, np.asarray(extended, dtype=np.int64), layers, slot.last_logits, acceptance,
                         self.engine.draft_part(slot.proposer, extended))


def _bytes_per_token(model, device) -> int:
    """K/V bytes one position takes in this model's cache, measured by one token's forward."""
    cache = new_kv_cache(model)
    with torch.inference_mode():
        forward(model, torch.zeros((1, 1), dtype=torch.long, device=device), cache, keep=1)
    return cache_nbytes(cache)
