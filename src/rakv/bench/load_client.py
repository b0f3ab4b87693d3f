"""The load test's client side (scripts/load_http.py, docs/serving.md "Over HTTP"): what one simulated user asks of
`rakv serve --http` and what it logs about each request.

Light on purpose (json and random only): the locustfile (scripts/locustfile_http.py) imports it inside locust's
gevent-patched process, and the in-process smoke test (tests/test_http_load.py) drives the same code with httpx.
The transport is the caller's: it hands `read_stream` the response's lines and closes the response when told to cut.

A user's log is JSONL, one line per request (`outcome`):
- `finished`: the stream ended with a finish reason and [DONE];
- `cut`: the client closed the connection after its first `cut_after` events (the server should abort it);
- `stopped`: the load generator stopped the user mid-request (its connection closed; aborted or finished);
- `refused`: 429 / 503 before anything was admitted (no id: the server keeps no record);
- `http-<status>`: another answer than 200; `error`: an SSE error event; `client-error`: the transport failed.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

CHAT_PATH, COMPLETIONS_PATH = "/v1/chat/completions", "/v1/completions"


@dataclass
class Ask:
    """One request a user sends: where, its body, and after how many SSE events the client cuts it (None: never)."""

    path: str
    body: dict
    cut_after: int | None


@dataclass
class Outcome:
    """What the client saw of one request: a line of its user's log."""

    path: str
    cut_after: int | None
    sent_s: float = field(default_factory=time.time)
    id: str | None = None
    status: int | None = None  # the HTTP status
    outcome: str = "client-error"
    events: int = 0  # SSE events before [DONE] (or the cut)
    finish_reason: str | None = None
    completion_tokens: int | None = None  # from the usage event
    error: str | None = None
    ended_s: float | None = None

    @classmethod
    def from_json(cls, line: dict) -> Outcome:
        """A line of a user's log (as `ClientLog.write` wrote it)."""
        return cls(**line)

    def end(self, outcome: str, error: str | None = None) -> Outcome:
        self.outcome, self.ended_s = outcome, time.time()
        if error is not None:
            self.error = error[:200]
        return self


@dataclass(frozen=True)
class Mix:
    """What users ask: prompts drawn at random, a share of chat requests, max_tokens in a range, a share cut."""

    prompts: list[str]
    chat_share: float = 0.2
    cut_share: float = 0.2
    max_tokens: tuple[int, int] = (32, 64)
    ignore_eos: bool = False

    def draw(self, rng: random.Random) -> Ask:
        prompt = rng.choice(self.prompts)
        body = {"max_tokens": rng.randint(*self.max_tokens), "stream": True,
                "stream_options": {"include_usage": True}, "temperature": 0.0}
        if self.ignore_eos:
            body["ignore_eos"] = True
        chat = rng.random() < self.chat_share
        body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
        cut = rng.choice((1, 2)) if rng.random() < self.cut_share else None  # after the first event or two
        return Ask(CHAT_PATH if chat else COMPLETIONS_PATH, body, cut)


def read_stream(lines: Iterable[str], seen: Outcome) -> Outcome:
    """Read a 200's server-sent events into `seen` (its id from the first event) until [DONE] or, for a request to
    cut, its `cut_after`-th event: then the outcome is `cut` and the caller closes the connection."""
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            if seen.outcome != "error":
                seen.end("finished" if seen.finish_reason else "error", None if seen.finish_reason else
                         "[DONE] without a finish reason")
            return seen
        event = json.loads(data)
        if "error" in event:
            seen.end("error", event["error"].get("message", "?"))
            continue
        seen.id = seen.id or event.get("id")
        seen.events += 1
        if event.get("usage"):
            seen.completion_tokens = event["usage"]["completion_tokens"]
        for choice in event.get("choices", []):
            seen.finish_reason = choice.get("finish_reason") or seen.finish_reason
        if seen.cut_after is not None and seen.events >= seen.cut_after and not seen.finish_reason:
            return seen.end("cut")
    if seen.outcome == "client-error":
        seen.end("client-error", "the stream ended without [DONE]")
    return seen


def read_whole(body: str, seen: Outcome) -> Outcome:
    """A 200's whole (not streamed) completion into `seen`."""
    answer = json.loads(body)
    seen.id, seen.events = answer.get("id"), 1
    seen.completion_tokens = (answer.get("usage") or {}).get("completion_tokens")
    seen.finish_reason = next((c.get("finish_reason") for c in answer.get("choices", [])), None)
    return seen.end("finished" if seen.finish_reason else "error", None if seen.finish_reason else "no finish reason")


def refused_or_failed(seen: Outcome, status: int, body: str) -> Outcome:
    """A non-200 answer: refused (429 / 503: never admitted), else `http-<status>` with its message."""
    seen.status = status
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body[:200]
    return seen.end("refused" if status in (429, 503) else f"http-{status}", message)


class ClientLog:
    """A user process's JSONL log (one line per request, each in one write: lines never interleave)."""

    def __init__(self, path: Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, seen: Outcome) -> None:
        os.write(self.fd, (json.dumps(asdict(seen)) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def read_logs(paths: Iterable[Path]) -> list[Outcome]:
    """Every line of the users' logs; a line of another shape stops with one line naming it."""
    outcomes = []
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                outcomes.append(Outcome.from_json(json.loads(line)))
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a client log line ({exc})") from None
    return outcomes
