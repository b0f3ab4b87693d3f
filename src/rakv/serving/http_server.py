"""`rakv serve --http`'s process: uvicorn serving the app (rakv.serving.http) around one engine loop.

`make_server` binds the socket (a taken port is one line before anything starts), builds the engine loop, the app
and uvicorn's server with the limits uvicorn enforces itself (connections, idle kept-alive connections) plus a head
timeout of our own; `serve_http` runs it: the engine starts, SIGTERM / Ctrl-C drain (new requests 503, running ones
finish within --drain-s), then the engine stops, what is left is aborted and recorded, and the summary is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import socket
import threading
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.serving.engine_loop import EngineLoop
from rakv.serving.http import Api, Tokenizing, build_app
from rakv.serving.http_options import HttpOptions
from rakv.serving.metrics import RunSummary
from rakv.serving.prometheus import ServerMetrics
from rakv.serving.server import ServeOptions, ServeParts


def head_timeout_protocol(read_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with one more timeout: a connection must send a whole request head within
    `read_timeout_s` of connecting or of its previous answer, else it is closed (uvicorn itself only times out a
    kept-alive connection that sends nothing, so a client trickling a head byte by byte would hold a connection)."""

    class HeadTimeout(H11Protocol):
        timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self):
            self._arm()
            super().on_response_complete()  # (a pipelined request's head may complete here: disarmed again)

        def handle_events(self):
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete and self.timer is not None:
                self.timer.cancel()
                self.timer = None

        def connection_lost(self, exc):
            if self.timer is not None:
                self.timer.cancel()
            super().connection_lost(exc)

        def _arm(self):
            if self.timer is not None:
                self.timer.cancel()
            self.timer = self.loop.call_later(read_timeout_s, self._expire)

        def _expire(self):
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()

    return HeadTimeout


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise RakvError(f"--http takes HOST:PORT (e.g. 127.0.0.1:8000), got '{text}'")
    return host or "127.0.0.1", int(port)


class HttpServer(uvicorn.Server):
    """uvicorn's server around the app and its engine loop: the engine starts with it, SIGTERM / Ctrl-C begin the
    drain (new requests 503 while running ones finish), and `serve_http` stops the engine after it."""

    def __init__(self, config: uvicorn.Config, loop: EngineLoop, listening: socket.socket, ready=None):
        super().__init__(config)
        self.engine_loop, self.listening, self.ready = loop, listening, ready

    @property
    def address(self) -> tuple[str, int]:
        return self.listening.getsockname()[:2]

    def handle_exit(self, sig, frame) -> None:
        self.engine_loop.draining = True
        super().handle_exit(sig, frame)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.ready is not None and self.started:
            self.ready(self.address)


def make_server(engine: Engine, options: ServeOptions, address: tuple[str, int], served_name: str,
                out: Path | None = None, parts: ServeParts | None = None, http: HttpOptions | None = None,
                ready=None) -> HttpServer:
    """The server and its engine loop, neither started (`serve_http` runs both; tests run them in a thread)."""
    http = http or HttpOptions.default()
    metrics = ServerMetrics(served_name, engine.proposer)
    loop = EngineLoop(engine, options, out, parts, http.max_waiting, metrics)
    app = build_app(Api(loop, Tokenizing(engine), served_name, options), metrics, http)
    config = uvicorn.Config(app, host=address[0], port=address[1], http=head_timeout_protocol(http.read_timeout_s),
                            limit_concurrency=http.max_connections, timeout_keep_alive=http.idle_timeout_s,
                            timeout_graceful_shutdown=http.drain_s, log_level="warning", access_log=False,
                            lifespan="off")
    return HttpServer(config, loop, listen(address), ready)


def listen(address: tuple[str, int]) -> socket.socket:
    """The listening socket, bound here so that a taken port is one line before anything starts (port 0: a free
    one, `HttpServer.address` says which)."""
    try:
        sock = socket.create_server(address, family=socket.AF_INET6 if ":" in address[0] else socket.AF_INET,
                                    reuse_port=False)
    except OSError as exc:
        raise RakvError(f"cannot listen on {address[0]}:{address[1]}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 128 << 10  # glibc's default starting value, kept fixed


def heap_kept_flat() -> None:
    """glibc only (elsewhere nothing): allocations of 128 KiB and more are mapped and unmapped, never kept on the
    heap. By default glibc raises that threshold to the largest block freed (up to 32 MiB), after which a server that
    frees tensors of ever-changing sizes (logits, K/V caches of each request's length) takes them from a heap that
    fragments and never shrinks: under scripts/load_http.py's 64 users the resident memory kept rising, 15 % over
    five minutes after the first, and stayed within 7 % with the threshold fixed."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def signals_kept():
    """SIGTERM and SIGINT handled by uvicorn while it serves (the drain), and by nothing after: uvicorn raises the
    signal again once it has stopped, for the handler that was there before it, which would kill the process before
    the engine stops and the summary is written. (In a thread other than the main one, uvicorn leaves signals be.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def serve_http(server: HttpServer) -> RunSummary | None:
    """Serve until SIGTERM / Ctrl-C (then drain: new requests 503, running ones finish within --drain-s); then the
    engine stops, what is left is aborted and recorded, and the summary is returned (with --out)."""
    heap_kept_flat()
    server.engine_loop.start()
    try:
        with signals_kept():
            server.run(sockets=[server.listening])
    finally:
        server.engine_loop.stop()
        server.listening.close()
    return server.engine_loop.finish()
