"""`rakv serve --http HOST:PORT`: an OpenAI-compatible completions endpoint on the engine step loop trace replay uses.

    rakv serve --pair smollm2 --http 127.0.0.1:8000 --out results/http
    curl -s 127.0.0.1:8000/v1/completions -d '{"prompt": "def fib(n):", "max_tokens": 16, "stream": true}'

so that clients written elsewhere (vLLM's `vllm bench serve --backend openai`) drive this engine and vLLM alike.

- `POST /v1/completions`: `prompt` (a string, or a list of token ids), `max_tokens` (16), `temperature` (the
  server's --temperature when absent; 0 = greedy), `top_p`, `seed`, `stream`, `stream_options.include_usage`,
  `ignore_eos` (vLLM's extension), `n` = 1; `model`, when given, must be the served name (--served-model-name).
- `GET /v1/models`, `GET /health`.

One thread runs the engine: between iterations it takes new requests and aborts from a queue, then runs one step
(rakv.serving.server.step_once: schedule -> execute -> update_from_output) and hands each request's newly confirmed
tokens to its handler's queue. Handler threads only parse, submit and write, so request state still changes in
the scheduler alone. A malformed request is answered 400 without reaching the engine; one over the context or the
K/V budget alone is refused by the scheduler (400); a client that goes away is aborted between iterations and its
K/V freed; the other requests are served on. With --out, requests.jsonl grows as requests end and summary.json /
iterations.jsonl are written when the server stops (Ctrl-C), as for a trace.
"""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from rakv.runtime.decoding import DecodeState, Sampling
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.serving.batchcost import ScaledCost
from rakv.serving.request import ServedRequest, Status
from rakv.serving.server import RecordWriter, ServeOptions, build_scheduler, finish_summary, record_of, step_once

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
IDLE_WAIT_S = 0.05  # how long the engine thread blocks on its inbox when nothing runs


class BadRequest(ValueError):
    """A request the endpoint answers 400 (or `status`) without it reaching the engine."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Completion:
    """A parsed /v1/completions body."""

    prompt: str | list[int]
    max_tokens: int
    sampling: Sampling
    stream: bool
    include_usage: bool
    ignore_eos: bool


def parse_completion(body: bytes, served_name: str, default: Sampling, ignore_eos: bool) -> Completion:
    """The body checked field by field: a BadRequest names the first thing wrong."""
    try:
        data = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    if data.get("model") not in (None, served_name):
        raise BadRequest(f"model '{data['model']}' is not served here; this server serves '{served_name}'", 404)
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            raise BadRequest("prompt must be a non-empty string or a non-empty list of token ids (one prompt per "
                             "request)")
    elif not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt must be a non-empty string or a non-empty list of token ids")
    if data.get("n", 1) != 1 or data.get("best_of") not in (None, 1):
        raise BadRequest("n and best_of must be 1 (one completion per request)")
    for unsupported in ("stop", "logprobs", "suffix", "logit_bias"):
        if data.get(unsupported) not in (None, [], 0, False, ""):
            raise BadRequest(f"'{unsupported}' is not supported by this server")
    if data.get("echo"):
        raise BadRequest("'echo' is not supported by this server")
    max_tokens = _number(data, "max_tokens", DEFAULT_MAX_TOKENS, int, lambda v: v >= 1, "an integer >= 1")
    temperature = _number(data, "temperature", default.temperature, float, lambda v: v >= 0, "a number >= 0")
    top_p = _number(data, "top_p", default.top_p, float, lambda v: 0 < v <= 1, "a number in (0, 1]")
    seed = _number(data, "seed", default.seed, int, lambda v: True, "an integer")
    stream_options = data.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise BadRequest("stream_options must be an object")
    return Completion(prompt, max_tokens, Sampling(temperature=temperature, top_p=top_p, seed=seed),
                      bool(data.get("stream", False)), bool(stream_options.get("include_usage", False)),
                      bool(data.get("ignore_eos", ignore_eos)))


def _number(data: dict, key: str, default, kind, ok, wanted: str):
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise BadRequest(f"{key} must be {wanted}, got {json.dumps(value)}")
    value = kind(value)
    if not ok(value):
        raise BadRequest(f"{key} must be {wanted}, got {json.dumps(value)}")
    return value


@dataclass
class Live:
    """A request in flight and the queue its handler reads: ("tokens", n confirmed so far) then ("end", request)."""

    request: ServedRequest
    events: queue.Queue = field(default_factory=queue.Queue)
    sent: int = 0


class EngineLoop:
    """The engine thread: requests in through `submit`, aborts through `abort`, tokens out through each Live's queue."""

    def __init__(self, engine: Engine, options: ServeOptions, out: Path | None, parts: dict):
        self.engine, self.options, self.out = engine, options, out
        cost = parts.get("batch_cost")
        self.batch_cost = ScaledCost(cost) if cost is not None else None  # its scale follows this server's iterations
        k_set = tuple(parts.get("k_set") or ())
        self.scheduler, self.executor = build_scheduler(engine, options, parts.get("controller"), self.batch_cost,
                                                        parts.get("tracker"), k_set)
        self.inbox: queue.Queue = queue.Queue()
        self.live: dict[str, Live] = {}
        self.records: list[dict] = []
        self.iterations: list[dict] = []
        self.writer = RecordWriter(out / "requests.jsonl") if out is not None else None
        self.start = time.perf_counter()
        self.stopping = threading.Event()
        self.tokenizer_lock = threading.Lock()  # one fast tokenizer, used from the handlers' threads and this one

    def encode(self, text: str) -> list[int]:
        with self.tokenizer_lock:
            return self.engine.encode(text)

    def decode(self, tokens: list[int]) -> str:
        with self.tokenizer_lock:
            return self.engine.pair.tokenizer.decode(tokens, skip_special_tokens=True)

    def now(self) -> float:
        return time.perf_counter() - self.start

    def submit(self, completion: Completion) -> Live:
        """A new request (tokenised and length-checked here, in the handler's thread): refused at once if bad."""
        now = self.now()
        state = DecodeState(completion.max_tokens, self.engine.pair.eos_token_id, completion.ignore_eos)
        request = ServedRequest(id=f"cmpl-{uuid.uuid4().hex[:16]}", arrival_s=now, prompt=[], state=state,
                                sampling=completion.sampling)
        live = Live(request)
        try:
            prompt = completion.prompt
            request.prompt = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
            vocabulary = self.engine.pair.target.module.config.vocab_size
            if any(t >= vocabulary for t in request.prompt):
                raise RakvError(f"a prompt token id is outside the vocabulary of {vocabulary}")
            self.engine.check_lengths(len(request.prompt), completion.max_tokens)
        except RakvError as exc:
            request.refuse(str(exc), now)
            self._close(live)
            return live
        self.inbox.put(("submit", live))
        return live

    def abort(self, live: Live) -> None:
        self.inbox.put(("abort", live))

    def run(self) -> None:
        """Until `stopping`: take what arrived, then one engine step; block briefly on the inbox when idle."""
        while not self.stopping.is_set():
            idle = not (self.scheduler.waiting or self.scheduler.running)
            self._drain(block=idle)
            if not (self.scheduler.waiting or self.scheduler.running):
                continue
            done = step_once(self.scheduler, self.executor, self.start, self.now(), self.batch_cost)
            for request in done.step.refused:
                self._close(self.live.pop(request.id))
            if done.output is None:
                continue
            self.iterations.append(done.record)
            for request_id in done.output.requests:
                live = self.live.get(request_id)
                if live is not None and len(live.request.state.tokens) > live.sent:
                    live.sent = len(live.request.state.tokens)
                    live.events.put(("tokens", live.sent))
            for request in done.finished:
                self._close(self.live.pop(request.id))

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
            while True:
                kind, live = item
                if kind == "submit":
                    self.live[live.request.id] = live
                    self.scheduler.waiting.append(live.request)
                elif live.request.id in self.live:  # an abort of a request still in flight
                    self.scheduler.abort(self.live.pop(live.request.id).request, "the client went away", self.now())
                    self._close(live)
                item = self.inbox.get_nowait()
        except queue.Empty:
            return

    def _close(self, live: Live) -> None:
        request = live.request
        record = record_of(request, self.decode(request.state.tokens))
        self.records.append(record)
        if self.writer is not None:
            self.writer.write(record)
        live.events.put(("end", request))

    def finish(self) -> dict | None:
        """After the engine thread stopped: summary.json and iterations.jsonl (with --out)."""
        if self.writer is None:
            return None
        self.writer.close()
        return finish_summary(self.engine, [], self.out, self.options, self.records, self.iterations, self.now())


def finish_reason(request: ServedRequest, eos: int | None) -> str:
    tokens = request.state.tokens
    return "stop" if (not request.state.ignore_eos and tokens and eos is not None and tokens[-1] == eos) else "length"


class Handler(BaseHTTPRequestHandler):
    """One connection's requests (ThreadingHTTPServer: a thread each)."""

    server_version = "rakv"
    protocol_version = "HTTP/1.1"
    loop: EngineLoop  # set on the subclass `make_server` builds
    served_name: str

    def log_message(self, format, *args) -> None:  # quiet: a line per request would swamp a benchmark's output
        pass

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.served_name, "object": "model",
                                                          "owned_by": "rakv", "max_model_len":
                                                              self.loop.engine.pair.max_context}]})
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/completions":
            self._error(404, f"no route {self.path} (this server has /v1/completions)")
            return
        try:
            completion = parse_completion(body, self.served_name, self.loop.options.sampling,
                                          self.loop.options.ignore_eos)
        except BadRequest as exc:
            self._error(exc.status, str(exc))
            return
        live = self.loop.submit(completion)
        try:
            if completion.stream:
                self._stream(live, completion)
            else:
                self._complete(live)
        except (BrokenPipeError, ConnectionResetError):
            self.loop.abort(live)

    def _next_event(self, live: Live):
        """The next event of this request; None once the client has gone (it is then aborted)."""
        while True:
            try:
                return live.events.get(timeout=0.5)
            except queue.Empty:
                if self._client_gone():
                    self.loop.abort(live)
                    return None

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _complete(self, live: Live) -> None:
        while (event := self._next_event(live)) is not None and event[0] != "end":
            pass
        if event is None:
            return
        request = live.request
        if request.status != Status.FINISHED:
            self._error(400, request.error or "refused")
            return
        choice = {"index": 0, "text": self.loop.decode(request.state.tokens), "logprobs": None,
                  "finish_reason": finish_reason(request, self.loop.engine.pair.eos_token_id)}
        self._json(200, self._envelope(request, [choice]) | {"usage": self._usage(request)})

    def _stream(self, live: Live, completion: Completion) -> None:
        """Server-sent events: a chunk per iteration that confirmed text, one with the finish reason, the usage
        (if asked), then [DONE]. A refusal before the first byte is a plain 400."""
        request, shown, started = live.request, "", False
        while (event := self._next_event(live)) is not None:
            if event[0] == "end" and request.status != Status.FINISHED and not started:
                self._error(400, request.error or "refused")
                return
            if not started:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                started = True
            text = self.loop.decode(request.state.tokens[:event[1]] if event[0] == "tokens" else request.state.tokens)
            if event[0] == "tokens" and text.endswith("\ufffd"):
                continue  # a multi-byte character cut in two: wait for its other half
            if len(text) > len(shown):
                self._event(self._envelope(request, [{"index": 0, "text": text[len(shown):], "logprobs": None,
                                                      "finish_reason": None}]))
                shown = text
            if event[0] == "end":
                reason = finish_reason(request, self.loop.engine.pair.eos_token_id) \
                    if request.status == Status.FINISHED else "abort"
                self._event(self._envelope(request, [{"index": 0, "text": "", "logprobs": None,
                                                      "finish_reason": reason}]))
                if completion.include_usage:
                    self._event(self._envelope(request, []) | {"usage": self._usage(request)})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True
                return

    def _envelope(self, request: ServedRequest, choices: list) -> dict:
        return {"id": request.id, "object": "text_completion", "created": int(time.time()), "model": self.served_name,
                "choices": choices}

    @staticmethod
    def _usage(request: ServedRequest) -> dict:
        prompt, completion = len(request.prompt), len(request.state.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _event(self, payload: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "Error")
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise RakvError(f"--http takes HOST:PORT (e.g. 127.0.0.1:8000), got '{text}'")
    return host or "127.0.0.1", int(port)


def make_server(engine: Engine, options: ServeOptions, address: tuple[str, int], served_name: str,
                out: Path | None = None, parts: dict | None = None) -> tuple[ThreadingHTTPServer, EngineLoop]:
    """The HTTP server and its engine loop (neither started: `serve_http` runs both; tests drive them)."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    loop = EngineLoop(engine, options, out, parts or {})
    handler = type("BoundHandler", (Handler,), {"loop": loop, "served_name": served_name})
    try:
        server = ThreadingHTTPServer(address, handler)
    except OSError as exc:
        raise RakvError(f"cannot listen on {address[0]}:{address[1]}: {exc.strerror or exc}") from None
    server.daemon_threads = True
    return server, loop


def serve_http(engine: Engine, options: ServeOptions, address: tuple[str, int], served_name: str,
               out: Path | None = None, parts: dict | None = None, ready=None) -> dict | None:
    """Serve until interrupted (Ctrl-C / SIGTERM via KeyboardInterrupt); returns the summary with --out."""
    server, loop = make_server(engine, options, address, served_name, out, parts)
    engine_thread = threading.Thread(target=loop.run, name="rakv-engine", daemon=True)
    engine_thread.start()
    if ready is not None:
        ready(server.server_address)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        loop.stopping.set()
        engine_thread.join()
    return loop.finish()
