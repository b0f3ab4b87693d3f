"""Traces: JSONL, one request per line, read and validated whole before any model work; and their generator.

A line: `id` (string), `arrival_s` (seconds from the start, >= 0), `prompt` (text), `max_new_tokens` (> 0);
optional `salt` (string). A multi-turn conversation: `conversation` (its id), `turn` (0, 1, ...); turn 0 has
`arrival_s`, each later turn `after_s` (think time after the previous turn finished) and, as its `prompt`, the
new user message, which the server appends to the previous turn's prompt and output (token ids, so the next
turn's prompt is an exact prefix hit of the previous turn's stored prompt and output).

`generate_trace` writes traces from real text (HumanEval prompts, WikiText-2 paragraphs): Poisson or gamma
(bursty) arrivals at a rate; shared-prefix groups (G groups of P requests sharing a long system prompt, as
SGLang's `generated-shared-prefix`); multi-turn conversations. Seeded; the settings are written beside the
trace (`<trace>.meta.json`). Its settings are declared once, as `TraceOptions`' fields: `rakv trace`'s flags are
generated from them (rakv.runtime.flags) and their defaults are conf/serving/default.yaml's `trace:`, for the CLI,
the serving study's base and every keyword a caller of generate_trace leaves out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np

from rakv.runtime.errors import RakvError
from rakv.runtime.paths import conf_file
from rakv.runtime.run_layout import trace_settings


@dataclass(frozen=True)
class TraceRequest:
    id: str
    arrival_s: float  # turn 0 / single requests: seconds from the start; later turns: resolved when served
    prompt: str  # a later turn: the new user message only
    max_new_tokens: int
    salt: str | None = None
    conversation: str | None = None
    turn: int = 0
    after_s: float = 0.0  # later turns: think time after the previous turn finished

    @property
    def follows(self) -> bool:
        """A later turn of a conversation: it arrives after the previous turn, not at `arrival_s`."""
        return self.conversation is not None and self.turn > 0


def _number(row: dict, name: str, where: str, *, required: bool) -> float | None:
    value = row.get(name)
    if value is None:
        if required:
            raise RakvError(f"{where}: missing field \"{name}\"")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise RakvError(f"{where}: field \"{name}\" must be a number >= 0, got {value!r}")
    return float(value)


def parse_request(row, where: str) -> TraceRequest:
    """One trace line's object, checked field by field (prompt contents are checked when served: an empty or
    too long prompt is refused alone)."""
    if not isinstance(row, dict):
        raise RakvError(f"{where}: expected a JSON object")
    if not isinstance(row.get("id"), str) or not row["id"]:
        raise RakvError(f"{where}: field \"id\" must be a non-empty string")
    if not isinstance(row.get("prompt"), str):
        raise RakvError(f"{where}: field \"prompt\" must be a string")
    new = row.get("max_new_tokens")
    if isinstance(new, bool) or not isinstance(new, int) or new <= 0:
        raise RakvError(f"{where}: field \"max_new_tokens\" must be an integer > 0, got {new!r}")
    if row.get("salt") is not None and not isinstance(row["salt"], str):
        raise RakvError(f"{where}: field \"salt\" must be a string")
    conversation, turn = row.get("conversation"), row.get("turn", 0)
    if conversation is not None and not isinstance(conversation, str):
        raise RakvError(f"{where}: field \"conversation\" must be a string")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise RakvError(f"{where}: field \"turn\" must be an integer >= 0, got {turn!r}")
    if turn and conversation is None:
        raise RakvError(f"{where}: field \"turn\" needs a \"conversation\"")
    follows = conversation is not None and turn > 0
    arrival = _number(row, "arrival_s", where, required=not follows)
    after = _number(row, "after_s", where, required=follows)
    return TraceRequest(id=row["id"], arrival_s=arrival or 0.0, prompt=row["prompt"], max_new_tokens=new,
                        salt=row.get("salt"), conversation=conversation, turn=turn, after_s=after or 0.0)


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Every request of a trace file, or a one-line error naming the line and the field."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RakvError(f"cannot read trace {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    requests, seen, turns = [], set(), {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RakvError(f"{where}: not valid JSON ({exc.msg})") from None
        request = parse_request(row, where)
        if request.id in seen:
            raise RakvError(f"{where}: field \"id\": '{request.id}' appears twice")
        seen.add(request.id)
        if request.conversation is not None:
            expected = turns.get(request.conversation, 0)
            if request.turn != expected:
                raise RakvError(f"{where}: field \"turn\": conversation '{request.conversation}' expects turn "
                                f"{expected} here, got {request.turn}")
            turns[request.conversation] = expected + 1
        requests.append(request)
    if not requests:
        raise RakvError(f"{path}: no requests")
    return requests


def write_trace(path: str | Path, requests: list[TraceRequest], meta: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for request in requests:
            row = {k: v for k, v in asdict(request).items() if v is not None}
            if request.follows:
                row.pop("arrival_s")
            else:
                row.pop("after_s")
            if request.conversation is None:
                row.pop("turn")
            fh.write(json.dumps(row) + "\n")
    trace_settings(path).write_text(json.dumps(meta, indent=1) + "\n")


ARRIVALS = ("poisson", "gamma")
KINDS = ("plain", "shared-prefix", "multi-turn", "interference", "structured")
DATASETS = ("humaneval", "wikitext2", "structured")  # rakv.runtime.workloads.dataset_texts


@dataclass(frozen=True)
class TraceOptions:
    """A trace's settings: `rakv trace`'s flags, the serving study's trace settings (conf/serving/default.yaml's
    `trace:` under each family's and the profile's overrides) and generate_trace's keywords. No field has a default
    here: conf/'s are the one source (`TraceOptions.default(**overrides)`)."""

    dataset: str = field(metadata={"choices": DATASETS, "help": "where the text comes from (the repository's copy)"})
    kind: str = field(metadata={"choices": KINDS, "help": "what the requests are"})
    arrivals: str = field(metadata={"choices": ARRIVALS, "help": "the arrival process"})
    burstiness: float = field(metadata={"help": "gamma arrivals' shape: 1 = Poisson, below 1 burstier"})
    rate: float = field(metadata={"help": "requests (multi-turn: conversations) per second"})
    requests: int = field(metadata={"help": "requests in the trace"})
    max_new_tokens: int = field(metadata={"help": "each request's output length"})
    prompt_words: int = field(metadata={"help": "words of each prompt's text"})
    groups: int = field(metadata={"help": "shared-prefix: system prompts"})
    system_words: int = field(metadata={"help": "shared-prefix: words of each system prompt"})
    turns: int = field(metadata={"help": "multi-turn: turns per conversation"})
    think_s: float = field(metadata={"help": "multi-turn: mean think time between turns, in seconds"})
    long_every: int = field(metadata={"help": "interference: every Nth request a long prompt"})
    long_words: int = field(metadata={"help": "interference: words of a long prompt (750: about 1,000 tokens)"})
    seed: int = field(metadata={"help": "the generator's seed"})

    @staticmethod
    def conf_defaults() -> dict:
        return dict(conf_file("serving/default.yaml").trace)

    @classmethod
    def default(cls, **overrides) -> TraceOptions:
        """conf/'s settings with `overrides`; an unknown name fails with the known ones."""
        unknown = sorted(set(overrides) - set(TRACE_FLAGS))
        if unknown:
            raise RakvError(f"unknown trace setting(s) {', '.join(unknown)}; the settings: {', '.join(TRACE_FLAGS)}")
        return replace(cls(**cls.conf_defaults()), **overrides)


TRACE_FLAGS = tuple(f.name for f in fields(TraceOptions))  # every setting is one of `rakv trace`'s flags
# structured: output that repeats the prompt's own keys, where prompt lookup's candidates should be accepted
STRUCTURED = ('Read the text below and answer with one JSON object with the keys "title", "topic", "people", '
              '"places", "dates" and "summary".\n\nText: {text}\n\nJSON: {{"title": "')


def arrival_times(rng: np.random.Generator, n: int, rate: float, process: str, burstiness: float) -> np.ndarray:
    """Arrival times of n requests at `rate` per second: Poisson, or gamma inter-arrivals of shape `burstiness`
    (vLLM benchmark_serving's convention: 1 = Poisson, below 1 burstier) and the same mean 1 / rate."""
    if rate <= 0:
        raise RakvError(f"the arrival rate must be positive, got {rate}")
    if process not in ARRIVALS:
        raise RakvError(f"unknown arrival process '{process}'; choose one of: {', '.join(ARRIVALS)}")
    if process == "poisson":
        gaps = rng.exponential(1.0 / rate, n)
    else:
        if burstiness <= 0:
            raise RakvError(f"the burstiness (gamma shape) must be positive, got {burstiness}")
        gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), n)
    gaps[0] = 0.0  # the first request arrives at the start
    return np.round(np.cumsum(gaps), 6)


def _clip_words(text: str, words: int) -> str:
    """The text up to the end of its `words`-th word, its own whitespace kept (code keeps its lines and indents)."""
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    return text[:ends[min(words, len(ends)) - 1]] if ends else ""


def _joined(pool: list[str], start: int, words: int) -> str:
    """Consecutive texts of `pool` from `start` (wrapping round) joined up to `words` words."""
    parts, count, i = [], 0, start
    while count < words:
        part = _clip_words(pool[i % len(pool)].strip(), words - count)
        parts.append(part)
        count += len(part.split())
        i += 1
    return "\n\n".join(parts)


def _conversations(rng, starts, turns: int, think_s: float, text, max_new_tokens: int) -> list[TraceRequest]:
    """Conversations starting at `starts`, `turns` turns each, a new text per turn; a later turn arrives after the
    previous one finished plus an exponential think time (mean `think_s`)."""
    out = []
    for c, start in enumerate(starts):
        for t in range(turns):
            message = ("\n" if t else "") + f"User: {text(c * turns + t)}\nAssistant:"
            out.append(TraceRequest(id=f"c{c}-t{t}", arrival_s=0.0 if t else float(start), prompt=message,
                                    max_new_tokens=max_new_tokens, conversation=f"c{c}", turn=t,
                                    after_s=round(float(rng.exponential(think_s)), 6) if t else 0.0))
    return out


def generate_trace(texts: list[tuple[str, str]], **settings) -> list[TraceRequest]:
    """A seeded trace from real text; `texts` are (id, text) pairs (rakv.runtime.workloads.dataset_texts), the
    `settings` TraceOptions' fields (conf/'s for those left out; `dataset` names where `texts` came from).

    plain: each request one text, its first `prompt_words` words. shared-prefix: `groups` system prompts of
    `system_words` words (each a run of texts), requests assigned round-robin, each its system prompt then a
    question from another text. multi-turn: `requests` // `turns` conversations of `turns` turns, each turn a
    new text; later turns arrive `think_s` (exponential mean) after the previous one finished. interference: plain
    requests, every `long_every`-th one a long prompt of `long_words` words (750 words: about 1,000 tokens), the
    prefill that blocks the others' next token. structured: each request asks for a JSON object about its text."""
    return _generated(texts, TraceOptions.default(**settings))


def _generated(texts: list[tuple[str, str]], options: TraceOptions) -> list[TraceRequest]:
    kind, requests, rate, seed = options.kind, options.requests, options.rate, options.seed
    arrivals, burstiness, max_new_tokens = options.arrivals, options.burstiness, options.max_new_tokens
    prompt_words, groups, system_words = options.prompt_words, options.groups, options.system_words
    turns, think_s, long_every, long_words = options.turns, options.think_s, options.long_every, options.long_words
    if kind not in KINDS:
        raise RakvError(f"unknown trace kind '{kind}'; choose one of: {', '.join(KINDS)}")
    if requests <= 0 or max_new_tokens <= 0 or prompt_words <= 0:
        raise RakvError("requests, max-new-tokens and prompt-words must be positive")
    rng = np.random.default_rng(seed)
    pool = [text for _, text in texts if len(text.split()) >= 8]
    if not pool:
        raise RakvError("no text long enough to build prompts from")
    order = rng.permutation(len(pool))

    def text(i: int, words: int = prompt_words) -> str:
        return _clip_words(pool[order[i % len(pool)]], words)

    if kind == "multi-turn":
        if turns <= 0:
            raise RakvError(f"turns must be positive, got {turns}")
        conversations = max(requests // turns, 1)
        starts = arrival_times(rng, conversations, rate, arrivals, burstiness)
        return _conversations(rng, starts, turns, think_s, text, max_new_tokens)
    times = arrival_times(rng, requests, rate, arrivals, burstiness)

    def long_text(start: int, words: int) -> str:
        return _joined([pool[j] for j in order], start, words)

    if kind == "plain":
        return [TraceRequest(id=f"r{i}", arrival_s=float(times[i]), prompt=text(i), max_new_tokens=max_new_tokens)
                for i in range(requests)]
    if kind == "structured":
        return [TraceRequest(id=f"s{i}", arrival_s=float(times[i]), prompt=STRUCTURED.format(text=text(i)),
                             max_new_tokens=max_new_tokens) for i in range(requests)]
    if kind == "interference":
        if long_every <= 0 or long_words <= 0:
            raise RakvError("long-every and long-words must be positive")
        return [TraceRequest(id=f"long{i}" if i % long_every == long_every - 1 else f"r{i}", arrival_s=float(times[i]),
                             prompt=long_text(i * 31, long_words) if i % long_every == long_every - 1 else text(i),
                             max_new_tokens=max_new_tokens) for i in range(requests)]
    if groups <= 0:
        raise RakvError(f"groups must be positive, got {groups}")
    # a long system prompt per group: consecutive texts joined up to `system_words` words
    systems = [f"You are an assistant. Context:\n{long_text(g * 7919, system_words)}\n\nQuestion: "
               for g in range(groups)]
    return [TraceRequest(id=f"g{i % groups}-r{i}", arrival_s=float(times[i]),
                         prompt=systems[i % groups] + text(i + groups * 7919 * 2), max_new_tokens=max_new_tokens)
            for i in range(requests)]
