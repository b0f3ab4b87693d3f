"""One request through the engine: prefix lookup and reuse, prefill, then AR or speculative decoding.

An *action* is the pair (reuse r, speculation depth k) of paper/main.tex (Method: "Cost model and controller");
fixed strategies are fixed actions, and the controller picks one action per request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from rakv.runtime.actions import Action
from rakv.runtime.cache import DraftPart, Hit, PrefixKVStore, namespace
from rakv.runtime.costmodel import acceptance_estimate
from rakv.runtime.decoding import (
    DecodeState,
    PhaseTimer,
    Sampling,
    crop_cache,
    decode_autoregressive,
    decode_speculative,
    forward,
    select_token,
)
from rakv.runtime.errors import RakvError
from rakv.runtime.kernels import new_kv_cache
from rakv.runtime.models import ModelPair, load_pair
from rakv.runtime.paths import conf_file
from rakv.runtime.proposers import Proposer, proposer_type
from rakv.runtime.verification import closed_form_moments

if TYPE_CHECKING:
    from rakv.runtime.controller import Decision
    from rakv.runtime.depth import RoundDepth


def engine_conf(pipeline, store) -> dict:
    """open_engine's options in a pipeline config node (device, dtype, kernels, threads: conf/config.yaml's keys) and
    its `cache` group's node (conf/cache/default.yaml): the one mapping from conf/'s keys to the options' names, for
    open_engine's defaults, the CLI's (rakv.runtime.engine_options.EngineOptions) and a stage's engine."""
    return {"device": pipeline.device, "dtype": pipeline.dtype, "kernels": pipeline.kernels,
            "threads": pipeline.threads, "salt": store.salt, "cache_budget_mib": store.budget_mib,
            "reuse_draft": store.reuse_draft}


def conf_engine_options() -> dict:
    """conf/'s defaults of open_engine's options (conf/config.yaml and conf/cache/default.yaml, as files)."""
    return engine_conf(conf_file("config.yaml"), conf_file("cache/default.yaml"))


def open_engine(pair: str, proposer: str, **options) -> Engine:
    """Load a pair and give it an empty prefix store. `options` are `loaded_engine`'s keywords (cache_budget_mib,
    salt, device, dtype, threads, kernels, reuse_draft); each one not given takes conf/'s default
    (conf_engine_options), never a default of its own here."""
    return loaded_engine(pair, proposer, **{**conf_engine_options(), **options})


def loaded_engine(pair: str, proposer: str, *, cache_budget_mib: float, salt: str | None, device: str, dtype: str,
                  threads: int | None, kernels: str, reuse_draft: bool, precision: str = "fp32") -> Engine:
    """An engine with every option given (open_engine fills them from conf/; `precision`, the target's weights
    (rakv.runtime.models.PRECISIONS), is a configuration's, conf/configuration/*.yaml)."""
    if cache_budget_mib <= 0:
        raise RakvError(f"the cache budget must be positive, got {cache_budget_mib} MiB")
    return Engine(load_pair(pair, device=device, dtype=dtype, threads=threads, kernels=kernels, precision=precision),
                  PrefixKVStore(budget_bytes=int(cache_budget_mib * (1 << 20))), proposer=proposer, salt=salt,
                  reuse_draft=reuse_draft)


@dataclass
class RequestResult:
    id: str
    prompt_tokens: int
    hit_tokens: int
    new_tokens: int
    token_ids: list[int]
    text: str
    reuse: bool
    k: int
    proposer: str
    rounds: int
    proposed: int
    accepted: int
    rejections: int  # rounds that ended at a rejected candidate
    empty_rounds: int  # speculative rounds without a candidate (one target token each)
    plain_rounds: int  # rounds whose candidates a per-round depth chose not to verify (one target token each)
    ttft_s: float
    latency_s: float
    tokens_per_s: float
    prefill_s: float
    kv_copy_s: float
    draft_prefill_s: float
    propose_s: float
    verify_s: float
    rollback_s: float
    decode_s: float
    store_insert_s: float  # after the response is complete; not part of latency
    exact_hit: bool = False
    draft_hit_tokens: int = 0  # positions of the draft model's K/V taken from the store (its prefill skipped them)
    reuse_draft: bool = False  # whether store entries carry the draft's state in this run (conf/cache: reuse_draft)
    peak_kv_bytes: int = 0  # most K/V bytes held at once during the request, the proposer's included
    # sums over the positions the rounds reached of the token-wise rule's acceptance probability sum_x min(p, q)
    # and of its Bernoulli variance (rakv.runtime.verification.closed_form_moments): the closed form the measured
    # `accepted` is checked against
    closed_form_accepted: float = 0.0
    closed_form_variance: float = 0.0
    # sums over the sampled rounds of the expected accepted candidates given each round's draft under token-wise and
    # under block verification, whichever rule ran (rakv.runtime.verification.expected_accepted): the two rules on the
    # same drafts (0.0 when greedy)
    expected_accepted_token: float = 0.0
    expected_accepted_block: float = 0.0
    temperature: float = 0.0  # of the request's sampling (0: greedy)
    verify: str = ""  # the verification rule of its sampled rounds (token, block); "" when greedy
    round_log: list[tuple[int, int]] = field(default_factory=list)
    strategy: str = ""  # set by rakv.runtime.strategies.run_strategy: ar, spec-k4, rakv-asd, or a sweep's action label
    available_hit_tokens: int = 0  # what the store offered, whether or not the action reused it
    available_draft_tokens: int = 0  # of those, positions for which it also held the draft's state
    predicted_latency_s: float | None = None  # the cost model's estimate for the action that ran
    decision: Decision | None = None  # rakv-asd only: the controller's choice and what it saw

    @property
    def action(self) -> Action:
        return Action(self.reuse, self.k)

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance_estimate(self.round_log)

    @property
    def closed_form_acceptance(self) -> float | None:
        """The mean closed-form acceptance over the positions reached: `acceptance_rate`'s expectation."""
        reached = self.accepted + self.rejections
        return self.closed_form_accepted / reached if reached else None

    def to_row(self) -> dict:
        """One flat row of scalars (the study's runs.parquet columns; the CLI's --json adds the text)."""
        row = {name: getattr(self, name) for name in ROW_FIELDS}
        row.update(action=self.action.label, acceptance_rate=self.acceptance_rate,
                   closed_form_acceptance=self.closed_form_acceptance)
        decision = self.decision
        row.update(predictions=json.dumps(decision.predictions) if decision else None,
                   tie_set=json.dumps(decision.tie_set) if decision and decision.tie_set is not None else None,
                   alpha_before=decision.alpha_before if decision else None,
                   alpha_after=decision.alpha_after if decision else None,
                   decision_s=decision.decision_s if decision else None,
                   ewma_accepted=decision.tracker_after[0] if decision and decision.tracker_after else None,
                   ewma_rejected=decision.tracker_after[1] if decision and decision.tracker_after else None,
                   ewma_matched=decision.tracker_after[2] if decision and decision.tracker_after else None,
                   ewma_by_match=json.dumps(decision.by_match_after) if decision and decision.by_match_after else None)
        return row

    def to_json(self) -> dict:
        """The row plus the request's id, output text and tokens, predictions as an object (`rakv generate --json`)."""
        row = self.to_row()
        row.update(id=self.id, proposer=self.proposer, text=self.text, token_ids=self.token_ids,
                   predictions=self.decision.predictions if self.decision else None)
        return row


def check_depth(proposer: Proposer | None, depth: RoundDepth | None) -> None:
    """A per-round depth needs a proposer with match classes (rakv.runtime.depth)."""
    if depth is not None and (proposer is None or not proposer.has_match_classes):
        raise RakvError(f"a per-round depth needs a proposer with match classes (prompt lookup), not "
                        f"{getattr(proposer, 'name', 'none')}")


ROW_FIELDS = tuple(f.name for f in fields(RequestResult)
                   if f.name not in ("id", "token_ids", "text", "round_log", "decision", "proposer"))


@dataclass
class Engine:
    pair: ModelPair
    store: PrefixKVStore
    proposer: str = "draft"
    salt: str | None = None  # the namespace salt of requests that name none (conf/cache: salt)
    reuse_draft: bool = True  # store entries carry the draft model's K/V too (conf/cache: reuse_draft)

    def __post_init__(self):
        proposer_type(self.proposer)  # an unknown name fails here

    @property
    def proposer_type(self) -> type[Proposer]:
        """The class of this engine's proposer (`proposer` is its name: the data calibrations and results carry)."""
        return proposer_type(self.proposer)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str) or not text.strip():
            raise RakvError("empty prompt")
        return self.pair.tokenizer(text, add_special_tokens=False)["input_ids"]

    def namespace(self, salt: str | None) -> str:
        return namespace(self.pair.target.fingerprint.key(), salt if salt is not None else self.salt)

    @property
    def draft_key(self) -> str | None:
        """The identity under which the draft's state is stored and found (None: no draft state reused)."""
        if not self.proposer_type.has_draft_model or not self.reuse_draft:
            return None
        return self.pair.draft.fingerprint.key()

    def peek(self, token_ids: list[int], salt: str | None = None) -> Hit:
        return self.store.peek(self.namespace(salt), np.asarray(token_ids, dtype=np.int64), self.draft_key)

    def draft_part(self, proposer: Proposer | None, token_ids: list[int]) -> DraftPart | None:
        """The draft's K/V for `token_ids` to store beside the target's, when it holds them (None otherwise)."""
        state = proposer.state_for(token_ids) if self.draft_key is not None and proposer is not None else None
        return DraftPart(self.draft_key, state) if state is not None else None

    def make_proposer(self) -> Proposer:
        return self.proposer_type.for_pair(self.pair)

    def with_proposer(self, proposer: str) -> Engine:
        """The same pair and store with another proposer (a configuration of several: each calibrates and runs its
        own kind on the one loaded target)."""
        return self if proposer == self.proposer else replace(self, proposer=proposer)

    def check_lengths(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if max_new_tokens <= 0:
            raise RakvError(f"max-new-tokens must be positive, got {max_new_tokens}")
        if prompt_tokens == 0:
            raise RakvError("empty prompt")
        limit = self.pair.max_context
        if prompt_tokens + max_new_tokens > limit:
            raise RakvError(f"prompt ({prompt_tokens} tokens) + max-new-tokens ({max_new_tokens}) exceeds "
                            f"the model context of {limit} tokens")

    def store_prompt(self, ns: str, prompt: np.ndarray, cache, prompt_logits: torch.Tensor, hit: Hit,
                     proposer: Proposer | None) -> None:
        """The prompt's K/V (and its draft's, when held) into the store after a request, unless the store held it
        already (an exact hit that also had the draft's part, or had nothing to add)."""
        draft = self.draft_part(proposer, prompt.tolist())
        if not hit.exact or (draft is not None and not hit.draft_tokens):
            crop_cache(cache, len(prompt))
            self.store.insert(ns, prompt, [(layer.keys, layer.values) for layer in cache.layers], prompt_logits,
                              draft=draft)

    @torch.inference_mode()
    def run(self, token_ids: list[int], action: Action, max_new_tokens: int, *, sampling: Sampling = Sampling(),
            salt: str | None = None, ignore_eos: bool = False, on_token: Callable[[int], None] | None = None,
            proposer: Proposer | None = None, request_id: str = "0",
            depth: RoundDepth | None = None) -> RequestResult:
        """Generate for one prompt under one action; the store is read only when `action.reuse`; `depth`: revise
        k every round (rakv.runtime.depth; only with k > 0)."""
        self.check_lengths(len(token_ids), max_new_tokens)
        device, target = self.pair.device, self.pair.target.module
        ns = self.namespace(salt)
        prompt = list(token_ids)
        prompt_array = np.asarray(prompt, dtype=np.int64)
        generator = None if sampling.greedy else torch.Generator(device=device).manual_seed(sampling.seed)
        proposer = proposer if proposer is not None else (self.make_proposer() if action.k else None)
        check_depth(proposer, depth)
        timer = PhaseTimer(device)
        state = DecodeState(max_new_tokens, self.pair.eos_token_id, ignore_eos, on_token)

        start = timer.now()
        hit, kv, stored_logits, draft_kv = Hit(prompt_length=len(prompt)), None, None, None
        drafting = action.k > 0 and proposer.reuses_stored_state
        with timer.phase("kv_copy"):
            if action.reuse:
                hit, kv, stored_logits, draft_kv = self.store.lookup(ns, prompt_array,
                                                                     self.draft_key if drafting else None)
            cache = new_kv_cache(target, kv)
        with timer.phase("prefill"):
            if stored_logits is not None:  # exact repeat: no forward pass before the first decode step
                prompt_logits = stored_logits
            else:
                ids = torch.tensor([prompt[hit.reused_tokens:]], dtype=torch.long, device=device)
                prompt_logits = forward(target, ids, cache, keep=1)[-1]
            state.emit([select_token(prompt_logits, sampling, generator)])
        ttft = timer.now() - start
        if action.k == 0:
            decode_autoregressive(target, cache, state, sampling, generator, timer, device)
        else:
            decode_speculative(target, cache, proposer, action.k, prompt, state, sampling, generator, timer, device,
                               depth, draft_kv)
        latency = timer.now() - start

        with timer.phase("store_insert"):
            self.store_prompt(ns, prompt_array, cache, prompt_logits, hit, proposer)
        s = timer.seconds
        expected, variance = closed_form_moments(state.round_log, state.closed_form_log)
        return RequestResult(
            id=str(request_id), prompt_tokens=len(prompt), hit_tokens=hit.reused_tokens,
            new_tokens=len(state.tokens), token_ids=state.tokens,
            text=self.pair.tokenizer.decode(state.tokens, skip_special_tokens=True),
            reuse=action.reuse, k=action.k, proposer=getattr(proposer, "name", "none"),
            rounds=state.rounds, proposed=state.proposed, accepted=state.accepted, rejections=state.rejections,
            empty_rounds=state.empty_rounds, plain_rounds=state.plain_rounds,
            ttft_s=ttft, latency_s=latency, tokens_per_s=len(state.tokens) / latency,
            prefill_s=s["prefill"], kv_copy_s=s["kv_copy"], draft_prefill_s=s["draft_prefill"],
            propose_s=s["propose"], verify_s=s["verify"], rollback_s=s["rollback"], decode_s=s["decode"],
            store_insert_s=s["store_insert"], exact_hit=hit.exact, peak_kv_bytes=state.peak_kv_bytes,
            draft_hit_tokens=hit.draft_tokens if draft_kv is not None else 0, reuse_draft=self.draft_key is not None,
            closed_form_accepted=expected, closed_form_variance=variance,
            expected_accepted_token=state.expected_accepted[0], expected_accepted_block=state.expected_accepted[1],
            temperature=max(sampling.temperature, 0.0), verify="" if sampling.greedy else sampling.verify,
            round_log=state.round_log)
