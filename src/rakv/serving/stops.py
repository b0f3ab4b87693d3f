"""Stop strings of a served request (OpenAI's `stop`): where its output ends, decided once for streaming and not.

A request with stop strings carries a `StopState` (a rakv.runtime.decoding.DecodeState) whose `confirmable` also
ends the output at the first token whose detokenised text contains a stop, so that a speculative round that accepts
several tokens at once confirms none past it (the executor's rollback keeps its logits at that token, as at an
end-of-sequence). `emit` then finishes the request and records where, in the output's text, the stop begins
(`stop_at`): the output's text is the detokenised output cut there, the stop text excluded (as OpenAI and vLLM), and
its finish reason is "stop". The check runs on the engine thread (rakv.serving.engine_loop), on the engine's own
tokenizer, as tokens are confirmed. `visible` is what a stream may show so far: the text before the stop, less the
last `len(longest stop) - 1` characters while the request runs (a stop may begin there), as vLLM holds them back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from rakv.runtime.decoding import DecodeState

MAX_STOPS = 16  # stop strings per request at most (OpenAI allows 4, vLLM any number)
MAX_STOP_CHARS = 256  # characters per stop string at most


def first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """(where the earliest stop begins in `text`, that stop), or None; at a tie the longer stop."""
    found = [(at, -len(stop), stop) for stop in stops if (at := text.find(stop)) >= 0]
    if not found:
        return None
    at, _, stop = min(found)
    return at, stop


@dataclass
class StopState(DecodeState):
    """A DecodeState whose output also ends at the first of `stops` in its text (`decode`: token ids -> text)."""

    stops: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None
    stop_at: int | None = None  # once stopped: where the stop begins in decode(tokens)
    stop_reason: str | None = None  # the stop string that ended it
    _memo: tuple = field(default=(), repr=False, compare=False)  # (len(tokens), new_tokens) -> (n, stop or None)

    def _scan(self, new_tokens: list[int]) -> tuple[int, tuple[int, str] | None]:
        """How many of `new_tokens` are confirmed, and the stop their last one completes (or None)."""
        n = super().confirmable(new_tokens)
        if not self.stops or n == 0:
            return n, None
        key = (len(self.tokens), tuple(new_tokens[:n]))
        if self._memo and self._memo[0] == key:
            return self._memo[1]
        answer: tuple[int, tuple[int, str] | None] = (n, None)
        for i in range(1, n + 1):  # the text before these tokens held no stop (else the request had ended)
            hit = first_stop(self.decode(self.tokens + new_tokens[:i]), self.stops)
            if hit is not None:
                answer = (i, hit)
                break
        self._memo = (key, answer)
        return answer

    def confirmable(self, new_tokens: list[int]) -> int:
        return self._scan(new_tokens)[0]

    def emit(self, new_tokens: list[int]) -> None:
        _, hit = self._scan(new_tokens)
        super().emit(new_tokens)
        if hit is not None:
            self.stop_at, self.stop_reason = hit
            self.finished = True


def stop_state(max_new_tokens: int, eos_token_id: int | None, ignore_eos: bool, stops: tuple[str, ...],
               decode: Callable[[list[int]], str]) -> DecodeState:
    """The state of a served request: a plain DecodeState without stop strings."""
    if not stops:
        return DecodeState(max_new_tokens, eos_token_id, ignore_eos)
    return StopState(max_new_tokens, eos_token_id, ignore_eos, stops=tuple(stops), decode=decode)


def output_text(state: DecodeState, text: str) -> str:
    """The output's text (`text`: its tokens detokenised) as answered: cut where its stop begins, if it stopped at
    one."""
    at = getattr(state, "stop_at", None)
    return text if at is None else text[:at]


def visible(state: DecodeState, text: str, final: bool) -> str:
    """What a stream may show of `text` (the detokenised tokens so far): the answer once final; before that, none of
    a stop nor of what may turn out to begin one."""
    text = output_text(state, text)
    stops = getattr(state, "stops", ())
    if final or not stops or getattr(state, "stop_at", None) is not None:
        return text
    return text[:max(len(text) - (max(len(s) for s in stops) - 1), 0)]
