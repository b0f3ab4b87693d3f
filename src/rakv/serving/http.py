"""`rakv serve --http HOST:PORT`: an OpenAI-compatible server on FastAPI + uvicorn, as vLLM and SGLang serve.

    rakv serve --pair smollm2 --http 127.0.0.1:8000 --out results/http
    curl -s 127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"prompt": "def fib(n):", "max_tokens": 16, "stream": true}'

- `POST /v1/completions`, `POST /v1/chat/completions` (the model's chat template), streaming as server-sent events
  (`stream_options.include_usage` as OpenAI's); the bodies are rakv.serving.protocol's pydantic models.
  Both honour `stop`, `n` and `logprobs`; completions also a list of prompts and `echo`, streamed too (the prompt in
  each choice's first chunk, each chunk with its tokens' log-probabilities; docs/serving.md lists them).
- `GET /v1/models`, `GET /health` (200 while the engine runs; 503 draining or stopped), `GET /metrics`
  (Prometheus, vLLM's names: rakv.serving.prometheus), `POST /tokenize`, `POST /detokenize`, `GET /version`
  (vLLM's bodies), `GET /openapi.json`, `GET /docs`. With --api-key (or $RAKV_API_KEY), every /v1 route needs
  `Authorization: Bearer KEY` (401 without it); the others stay open, as vLLM's.

Handlers only validate, tokenise, submit and stream: the engine thread (rakv.serving.engine_loop.EngineLoop) owns
the scheduler. Every input is bounded before it reaches the engine (docs/serving.md, "Over HTTP"): the body's size
(413), how long its head and body take to arrive (408 / closed), each field (400, one line, OpenAI's error shape),
`max_tokens` and the prompt against the context (a string prompt too long to fit is refused before it is
tokenised; tokenising runs in a worker thread on the handlers' own tokenizer, never under a lock the engine takes),
the queue (429 with Retry-After), connections (503). A request whose serving raises ends alone with a 500; an engine
that cannot go on answers 503 to everyone waiting and on /health. SIGTERM / Ctrl-C drains: new requests 503,
running ones finish within --drain-s, then requests.jsonl is complete and summary.json written (with --out).
The process around this app (uvicorn, the socket, the drain) is rakv.serving.http_server's.
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from importlib.metadata import version as package_version

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.serving.engine_loop import END, SCORED, EngineLoop, Live, Overloaded, Unavailable, finish_reason
from rakv.serving.http_options import RETRY_AFTER_S, HttpOptions
from rakv.serving.prometheus import CONTENT_TYPE, ServerMetrics
from rakv.serving.protocol import (
    UNION_RULES,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Delta,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    SamplingFields,
    TokenizeRequest,
    TokenizeResponse,
    TokenLogprob,
    TopLogprob,
    Usage,
    VersionResponse,
    error_body,
)
from rakv.serving.request import ServedRequest, Status
from rakv.serving.scoring import Scored
from rakv.serving.server import ServeOptions
from rakv.serving.stops import output_text, visible

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.5  # how often a waiting handler checks that its client is still there
ERRORS = {status: {"model": ErrorResponse} for status in (400, 401, 404, 408, 413, 429, 500, 503)}
SSE = {200: {"content": {"text/event-stream": {}}}}


class ApiError(HTTPException):
    """An answer other than 200: its status and one line (rendered as OpenAI's error body)."""

    def __init__(self, status: int, message: str, retry: bool = False):
        super().__init__(status, message, {"Retry-After": str(RETRY_AFTER_S)} if retry else None)


class Tokenizing:
    """The handlers' side of the tokenizer: copies of their own, so that no handler ever waits on a lock the engine
    thread takes. `encode_*` run in worker threads (one at a time: a fast tokenizer is not safe to share across
    threads); `decode` in the event loop's thread only."""

    def __init__(self, engine: Engine):
        tokenizer = engine.pair.tokenizer
        self.encoder, self.decoder = copy.deepcopy(tokenizer), copy.deepcopy(tokenizer)
        self.lock = threading.Lock()
        self.engine = engine
        self.vocabulary = engine.pair.target.module.config.vocab_size
        self.max_context = engine.pair.max_context
        # a string longer than this has more tokens than the context: refused without tokenising it
        self.max_chars = self.max_context * max(len(piece) for piece in tokenizer.get_vocab())

    def completion(self, body: CompletionRequest) -> list[list[int]]:
        """Each prompt's token ids, checked against the vocabulary and the context."""
        prompts = []
        for prompt in body.prompts:
            if isinstance(prompt, str):
                self._check_chars(len(prompt))
                with self.lock:
                    prompt = self.encoder.encode(prompt, add_special_tokens=False)
            elif any(t >= self.vocabulary for t in prompt):
                raise ApiError(400, f"prompt: a token id is outside the vocabulary of {self.vocabulary}")
            prompts.append(self._checked(list(prompt), body.new_tokens))
        return prompts

    def chat(self, body: ChatCompletionRequest) -> list[int]:
        if not getattr(self.encoder, "chat_template", None):
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        self._check_chars(sum(len(m.text) for m in body.messages))
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in body.messages]
        with self.lock:
            ids = self.encoder.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return self._checked(list(ids["input_ids"] if hasattr(ids, "keys") else ids), body.new_tokens)

    def decode(self, tokens: list[int]) -> str:
        return self.decoder.decode(tokens, skip_special_tokens=True)

    def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        """POST /tokenize: as vLLM's (special tokens added to a prompt by default, not to rendered messages)."""
        if body.prompt is not None:
            self._check_chars(len(body.prompt))
            with self.lock:
                ids = self.encoder.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
        else:
            if not getattr(self.encoder, "chat_template", None):
                raise ApiError(400, "this model has no chat template")
            self._check_chars(sum(len(m.text) for m in body.messages))
            messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text}
                        for m in body.messages]
            with self.lock:
                text = self.encoder.apply_chat_template(messages, add_generation_prompt=body.add_generation_prompt,
                                                        tokenize=False)
                ids = self.encoder.encode(text, add_special_tokens=bool(body.add_special_tokens))
            ids = list(ids)
        strs = None
        if body.return_token_strs:
            with self.lock:
                strs = self.encoder.convert_ids_to_tokens(ids)
        return TokenizeResponse(count=len(ids), max_model_len=self.max_context, tokens=ids, token_strs=strs)

    def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        if any(t >= self.vocabulary for t in body.tokens):
            raise ApiError(400, f"tokens: a token id is outside the vocabulary of {self.vocabulary}")
        return DetokenizeResponse(prompt=self.decode(body.tokens))

    def _check_chars(self, chars: int) -> None:
        if chars > self.max_chars:
            raise ApiError(400, f"the prompt ({chars} characters) is longer than the context of {self.max_context} "
                                "tokens can hold")

    def _checked(self, prompt: list[int], new_tokens: int) -> list[int]:
        try:
            self.engine.check_lengths(len(prompt), max(new_tokens, 1))  # (0: echo scores the prompt alone)
        except RakvError as exc:
            raise ApiError(400, str(exc)) from None
        return prompt


class Limits:
    """ASGI middleware: a body larger than the limit is refused 413 (by its Content-Length before a byte is read, or
    as it arrives), and a body that does not arrive within the read timeout 408."""

    def __init__(self, app, max_bytes: int, read_timeout_s: float):
        self.app, self.max_bytes, self.read_timeout_s = app, max_bytes, read_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send, 413, f"the body ({int(length)} bytes) is over {self.max_bytes} bytes")
        received, complete, deadline = 0, False, time.monotonic() + self.read_timeout_s

        async def limited():
            nonlocal received, complete
            if complete:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise ApiError(408, f"the body did not arrive within {self.read_timeout_s:g} s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise ApiError(413, f"the body is over {self.max_bytes} bytes")
                complete = not message.get("more_body", False)
            return message

        await self.app(scope, limited, send)

    @staticmethod
    async def _refuse(send, status: int, message: str):
        await JSONResponse(error_body(status, message), status)(
            {"type": "http"}, None, send)


class ApiKey:
    """ASGI middleware (--api-key, as vLLM's): a /v1 request without `Authorization: Bearer KEY` is refused 401."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1") and scope["method"] != "OPTIONS":  # (as vLLM)
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                response = JSONResponse(error_body(401, "a valid API key is required: 'Authorization: Bearer KEY'"),
                                        401, headers={"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


@dataclass
class Api:
    """What the routes share: the engine loop, the handlers' tokenizer, the served name, the defaults."""

    loop: EngineLoop
    tokenizing: Tokenizing
    served_name: str
    options: ServeOptions

    def check_model(self, model: str | None) -> None:
        if model not in (None, self.served_name):
            raise ApiError(404, f"model '{model}' is not served here; this server serves '{self.served_name}'")

    async def generate(self, http: Request, body: SamplingFields, prompts: list[list[int]], chat: bool,
                       texts: list[str] | None = None):
        """Submit each prompt's n choices, then answer: the whole completion, or a stream once the first event is
        in. A request refused or failed before its first token is answered with its status instead (its other
        choices aborted). `texts`: the prompts as text, for echo."""
        if body.n > 1 and body.sampling(self.options.sampling).greedy:  # as vLLM's SamplingParams refuses it
            raise ApiError(400, f"n must be 1 when using greedy sampling, got {body.n}")
        if getattr(body, "max_tokens", None) == 0:  # echo alone: the prompts scored, nothing generated
            return await self.echoed(body, prompts, texts)
        stop_at_eos, kind = body.stops_at_eos(self.options.ignore_eos), "chatcmpl" if chat else "cmpl"
        served = [self.loop.new_request(prompt, body.new_tokens, body.sampling(self.options.sampling, j),
                                        stop_at_eos, kind, body.stops) for prompt in prompts for j in range(body.n)]
        events: asyncio.Queue = asyncio.Queue()
        running = asyncio.get_running_loop()

        def notifier(index: int):
            def notify(event):  # from the engine thread
                try:
                    running.call_soon_threadsafe(events.put_nowait, (index, event))
                except RuntimeError:  # the event loop has closed: the server stopped, nobody is waiting
                    pass
            return notify

        lives: list[Live] = []
        try:
            for index, request in enumerate(served):
                lives.append(self.loop.submit(request, notifier(index)))
        except (Overloaded, Unavailable) as exc:
            for live in lives:
                self.loop.abort(live)
            raise ApiError(429 if isinstance(exc, Overloaded) else 503, str(exc), retry=True) from None
        ended: set[int] = set()
        try:
            event = await self.next_event(http, events)
            while event is not None:
                if event[1][0] == END:
                    ended.add(event[0])
                    if served[event[0]].status != Status.FINISHED:
                        break
                if body.stream or len(ended) == len(served):
                    break
                event = await self.next_event(http, events)
        except BaseException:  # cancelled: the client went away (or the server is stopping)
            for live in lives:
                self.loop.abort(live)
            raise
        if event is None:  # the client went away
            for live in lives:
                self.loop.abort(live)
            return Response(status_code=499)
        if event[1][0] == END and served[event[0]].status != Status.FINISHED:
            for index, live in enumerate(lives):
                if index not in ended:
                    self.loop.abort(live)
            raise self.unfinished(served[event[0]])
        if not body.stream:
            return await self.whole(served, body, prompts, texts, chat)
        stream = Stream(self, lives, events, chat, body.include_usage, len(prompts),
                        None if chat else body.logprobs, texts if not chat and body.echo else None)
        return event_stream(stream.events(event))

    @staticmethod
    async def next_event(http: Request, events: asyncio.Queue):
        """The request's next event; None once its client has gone."""
        while True:
            try:
                return await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
            except TimeoutError:
                if await http.is_disconnected():
                    return None

    def unfinished(self, served: ServedRequest) -> ApiError:
        """The answer to a request that ended without finishing."""
        reason = served.error or "not served"
        if served.status == Status.REFUSED:
            return ApiError(400, reason)
        if served.status == Status.FAILED and self.loop.dead is None:
            return ApiError(500, reason)
        return ApiError(503, reason, retry=True)  # the engine stopped, or the server is stopping

    async def scores(self, sequences: list[list[int]], top: int) -> list[Scored]:
        """Each sequence scored by the target on the engine thread (rakv.serving.scoring)."""
        running = asyncio.get_running_loop()
        futures = [running.create_future() for _ in sequences]

        def notifier(future):
            def notify(event):  # from the engine thread
                def settle():
                    if not future.done():
                        future.set_result(event)
                try:
                    running.call_soon_threadsafe(settle)
                except RuntimeError:
                    pass
            return notify

        for ids, future in zip(sequences, futures):
            try:
                self.loop.score(ids, top, notifier(future))
            except Overloaded as exc:
                raise ApiError(429, str(exc), retry=True) from None
            except Unavailable as exc:
                raise ApiError(503, str(exc), retry=True) from None
        results = []
        for future in futures:
            kind, value = await future
            if kind != SCORED:
                raise ApiError(503 if self.loop.dead else 500, f"scoring failed: {value}")
            results.append(value)
        return results

    def logprobs(self, ids: list[int], scored: Scored, start: int, offset: int = 0) -> CompletionLogprobs:
        """OpenAI's logprobs of positions `start`.. of `ids`, their text offsets counted from `offset`."""
        decode = self.tokenizing.decode
        out = CompletionLogprobs()
        for i in range(start, len(ids)):
            token = decode([ids[i]])
            out.tokens.append(token)
            out.token_logprobs.append(scored.logprobs[i])
            top = scored.top[i]
            if top is None:
                out.top_logprobs.append(None)
            else:
                alternatives = {decode([t]): lp for t, lp in top}
                alternatives.setdefault(token, scored.logprobs[i])
                out.top_logprobs.append(alternatives)
            out.text_offset.append(offset)
            offset += len(token)
        return out

    def chat_logprobs(self, ids: list[int], scored: Scored, start: int) -> ChatLogprobs:
        """OpenAI's chat logprobs of positions `start`.. of `ids` (the generated tokens)."""
        decode = self.tokenizing.decode

        def entry(token: int, logprob: float) -> TopLogprob:
            text = decode([token])
            return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode()))

        content = []
        for i in range(start, len(ids)):
            own = entry(ids[i], scored.logprobs[i])
            content.append(TokenLogprob(**own.model_dump(), top_logprobs=[entry(t, lp) for t, lp in scored.top[i]]))
        return ChatLogprobs(content=content)

    async def echoed(self, body: CompletionRequest, prompts: list[list[int]], texts: list[str] | None):
        """max_tokens 0 with echo: each prompt's text (and with logprobs, its log-probabilities), n times; streamed,
        one chunk per choice."""
        scored = await self.scores(prompts, body.logprobs) if body.logprobs is not None else [None] * len(prompts)
        choices = []
        for i, (prompt, result) in enumerate(zip(prompts, scored)):
            text = texts[i] if texts else self.tokenizing.decode(prompt)
            logprobs = self.logprobs(prompt, result, 0) if result is not None else None
            choices += [CompletionChoice(index=i * body.n + j, text=text, logprobs=logprobs, finish_reason="length")
                        for j in range(body.n)]
        tokens = sum(len(p) for p in prompts)
        whole = CompletionResponse(id=f"cmpl-{uuid.uuid4().hex[:24]}", model=self.served_name, choices=choices,
                                   usage=Usage(prompt_tokens=tokens, completion_tokens=0, total_tokens=tokens))
        return event_stream(echoed_events(whole, body.include_usage)) if body.stream else whole

    async def whole(self, served: list[ServedRequest], body: SamplingFields, prompts: list[list[int]],
                    texts: list[str] | None, chat: bool):
        n, usage = body.n, usage_of(served, prompts)
        outputs = [output_text(r.state, self.tokenizing.decode(r.state.tokens)) for r in served]
        if chat:
            scored = [None] * len(served)
            if body.logprobs:
                scored = await self.scores([r.tokens for r in served], body.top_logprobs or 0)
            return ChatCompletionResponse(id=served[0].id, model=self.served_name, usage=usage, choices=[
                ChatChoice(index=i, message=AssistantMessage(content=text), finish_reason=finish_reason(r),
                           stop_reason=stop_reason(r),
                           logprobs=None if result is None else self.chat_logprobs(r.tokens, result, len(r.prompt)))
                for i, (r, text, result) in enumerate(zip(served, outputs, scored))])
        scored = [None] * len(served)
        if body.logprobs is not None:
            scored = await self.scores([r.tokens for r in served], body.logprobs)
        choices = []
        for i, (request, text, result) in enumerate(zip(served, outputs, scored)):
            prompt = prompts[i // n]
            logprobs = None
            if result is not None:
                logprobs = self.logprobs(request.tokens, result, 0 if body.echo else len(prompt))
            if body.echo:
                text = (texts[i // n] if texts else self.tokenizing.decode(prompt)) + text
            choices.append(CompletionChoice(index=i, text=text, logprobs=logprobs, finish_reason=finish_reason(request),
                                            stop_reason=stop_reason(request)))
        return CompletionResponse(id=served[0].id, model=self.served_name, usage=usage, choices=choices)


@dataclass
class Stream:
    """One request's server-sent events: per choice, a chunk per iteration that confirmed text and one with its
    finish reason; then the usage (if asked), then [DONE]. A client that goes away mid-stream has every choice still
    running aborted (its K/V freed). Completions with `echo`: each choice's first chunk is its prompt's text (with
    `logprobs`, the prompt's log-probabilities); with `logprobs` (`top`), each chunk carries those of the tokens
    confirmed since the previous one (the text of a token held back for a stop string may follow in a later chunk),
    scored by the target over the sequence so far, so that a stream's log-probabilities put together are the whole
    answer's."""

    api: Api
    lives: list[Live]
    queue: asyncio.Queue
    chat: bool
    include_usage: bool
    prompts: int
    top: int | None = None  # completions' logprobs
    texts: list[str] | None = None  # completions' echo: each prompt's text

    async def events(self, event):
        shown, ended = [""] * len(self.lives), set()
        n = len(self.lives) // self.prompts
        # per choice: positions of its tokens (prompt + output) whose log-probabilities were sent; their text offset
        reported = [len(live.request.prompt) for live in self.lives]
        offsets = [0] * len(self.lives)
        try:
            if self.chat:
                for index in range(len(self.lives)):
                    yield self.chunk(index, Delta(role="assistant", content=""))
            if self.texts is not None:  # echo: the prompt first
                for index, live in enumerate(self.lives):
                    logprobs = None
                    if self.top is not None:
                        prompt = live.request.prompt
                        logprobs = self.api.logprobs(prompt, (await self.api.scores([prompt], self.top))[0], 0)
                        offsets[index] = next_offset(logprobs, 0)
                    yield self.chunk(index, self.texts[index // n], logprobs=logprobs)
            while True:
                index, (kind, upto) = event
                served = self.lives[index].request
                final = kind == END
                tokens = served.state.tokens if final else served.state.tokens[:upto]
                text = visible(served.state, self.api.tokenizing.decode(tokens), final)
                grows = len(text) > len(shown[index]) and (final or not text.endswith("\ufffd"))  # (half a char)
                logprobs = None
                if self.top is not None and (grows or final) and len(served.prompt) + len(tokens) > reported[index]:
                    ids = served.prompt + tokens
                    scored = (await self.api.scores([ids], self.top))[0]
                    logprobs = self.api.logprobs(ids, scored, reported[index], offsets[index])
                    reported[index], offsets[index] = len(ids), next_offset(logprobs, offsets[index])
                if grows:
                    delta = text[len(shown[index]):]
                    yield self.chunk(index, Delta(content=delta) if self.chat else delta, logprobs=logprobs)
                    shown[index], logprobs = text, None
                if final:
                    ended.add(index)
                    async for line in self.closing(index, served, logprobs):
                        yield line
                    if len(ended) == len(self.lives):
                        async for line in self.done():
                            yield line
                        return
                event = await self.queue.get()
        except ApiError as exc:  # scoring refused (the queue full) or failed mid-stream: said in the stream, then ended
            yield sse(error_body(exc.status_code, exc.detail))
            yield b"data: [DONE]\n\n"
        finally:
            for index, live in enumerate(self.lives):
                if index not in ended:  # the client went away, or the server is stopping: the engine drops it
                    self.api.loop.abort(live)

    async def closing(self, index: int, served: ServedRequest, logprobs: CompletionLogprobs | None = None):
        if served.status != Status.FINISHED:
            error = self.api.unfinished(served)
            yield sse(error_body(error.status_code, error.detail))
        reason = finish_reason(served) or "abort"
        yield self.chunk(index, Delta() if self.chat else "", reason, stop_reason(served), logprobs)

    async def done(self):
        if self.include_usage:
            served = [live.request for live in self.lives]
            n = len(served) // self.prompts
            usage = usage_of(served, [r.prompt for r in served[::n]])
            first = served[0].id
            envelope = ChatCompletionChunk(id=first, model=self.api.served_name, choices=[], usage=usage) \
                if self.chat else CompletionResponse(id=first, model=self.api.served_name, choices=[], usage=usage)
            yield sse(envelope.model_dump())
        yield b"data: [DONE]\n\n"

    def chunk(self, index: int, content, reason: str | None = None, stop: str | None = None,
              logprobs: CompletionLogprobs | None = None) -> bytes:
        served, name = self.lives[0].request, self.api.served_name
        if self.chat:
            return sse(ChatCompletionChunk(id=served.id, model=name, choices=[
                ChatChunkChoice(index=index, delta=content, finish_reason=reason, stop_reason=stop)
            ]).model_dump(exclude_none=True))
        return sse(CompletionResponse(id=served.id, model=name, choices=[
            CompletionChoice(index=index, text=content, logprobs=logprobs, finish_reason=reason, stop_reason=stop)
        ]).model_dump(exclude={"usage"}))


def event_stream(events) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def echoed_events(whole: CompletionResponse, include_usage: bool):
    """A scored-only answer (echo, max_tokens 0) as a stream: each choice one chunk, then the usage, then [DONE]."""
    for choice in whole.choices:
        yield sse(CompletionResponse(id=whole.id, model=whole.model, choices=[choice]).model_dump(exclude={"usage"}))
    if include_usage:
        yield sse(CompletionResponse(id=whole.id, model=whole.model, choices=[], usage=whole.usage).model_dump())
    yield b"data: [DONE]\n\n"


def next_offset(logprobs: CompletionLogprobs, offset: int) -> int:
    """The text offset after `logprobs`' tokens (`offset` when it has none)."""
    return logprobs.text_offset[-1] + len(logprobs.tokens[-1]) if logprobs.tokens else offset


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def stop_reason(request: ServedRequest) -> str | None:
    """vLLM's stop_reason: the stop string that ended the request (None for an end-of-sequence or the length)."""
    return getattr(request.state, "stop_reason", None)


def usage_of(served: list[ServedRequest], prompts: list[list[int]]) -> Usage:
    """Each prompt's tokens once (whatever its n), and every choice's output tokens."""
    prompt, completion = sum(len(p) for p in prompts), sum(len(r.state.tokens) for r in served)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def build_app(api: Api, metrics: ServerMetrics, http: HttpOptions) -> FastAPI:
    """The routes, the error shape and the body limits around one engine loop."""
    app = FastAPI(title="rakv serve", summary="RAKV-ASD's OpenAI-compatible server", version="1")
    app.add_middleware(Limits, max_bytes=http.max_body_bytes, read_timeout_s=http.read_timeout_s)
    if http.key is not None:
        app.add_middleware(ApiKey, key=http.key)  # (added last: runs first, before a body is read)
    add_error_handlers(app)

    @app.post("/v1/completions", response_model=CompletionResponse, responses={**ERRORS, **SSE})
    async def completions(body: CompletionRequest, request: Request):
        api.check_model(body.model)
        prompts = await anyio.to_thread.run_sync(api.tokenizing.completion, body)
        texts = [p if isinstance(p, str) else None for p in body.prompts] if body.echo else None
        if texts is not None:
            texts = [t if t is not None else api.tokenizing.decode(p) for t, p in zip(texts, prompts)]
        return await api.generate(request, body, prompts, chat=False, texts=texts)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses={**ERRORS, **SSE})
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        api.check_model(body.model)
        prompt = await anyio.to_thread.run_sync(api.tokenizing.chat, body)
        return await api.generate(request, body, [prompt], chat=True)

    @app.get("/v1/models", response_model=ModelList)
    async def models():
        return ModelList(data=[ModelCard(id=api.served_name, max_model_len=api.tokenizing.max_context)])

    @app.get("/health", response_model=Health, responses={503: {"model": Health}})
    async def health():
        status, reason = api.loop.health()
        return JSONResponse(Health(status=status, reason=reason).model_dump(), 200 if status == "ok" else 503)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=ERRORS)
    async def tokenize(body: TokenizeRequest):
        api.check_model(body.model)
        return await anyio.to_thread.run_sync(api.tokenizing.tokenize, body)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
    async def detokenize(body: DetokenizeRequest):
        api.check_model(body.model)
        return api.tokenizing.detokenize(body)

    @app.get("/version", response_model=VersionResponse)
    async def version():
        return VersionResponse(version=package_version("rakv"))

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app


def add_error_handlers(app: FastAPI) -> None:
    """Every answer other than 200 in OpenAI's error shape, with one line of message."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body(400, "the body is not valid JSON"), 400)
        if first.get("type") in ("model_attributes_type", "dict_type"):
            return JSONResponse(error_body(400, "the body must be a JSON object, sent as application/json"), 400)
        loc = [part for part in first.get("loc", ()) if part != "body"]
        union = next((i for i, part in enumerate(loc) if part in UNION_RULES), None)
        if union is not None and union + 1 < len(loc):  # a union's member failed: say what the field must be
            loc = loc[:union + 1]
            message = f"must be {UNION_RULES[loc[-1]]}"
        else:
            message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        where = ".".join(str(part) for part in loc)
        return JSONResponse(error_body(400, f"{where}: {message}" if where else message, where or None), 400)

    @app.exception_handler(HTTPException)
    async def answered(request: Request, exc: HTTPException):
        headers, message = dict(exc.headers or {}), str(exc.detail)
        if exc.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            message = f"no route {request.method} {request.url.path}"
        if exc.status_code == 408:
            headers["Connection"] = "close"  # a slow client: its connection goes
        return JSONResponse(error_body(exc.status_code, message), exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):
        log.exception("a handler raised")
        return JSONResponse(error_body(500, f"{type(exc).__name__}: {exc}"), 500)
