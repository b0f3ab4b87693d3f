"""A client that reuses a kept-alive connection at the moment the server's idle timeout closes it: how many of its
requests are lost to a reset connection, for a server idle timeout shorter than the client's pool keep-alive (the
race: the server closes an idle connection just as the client sends on it, and its kernel answers the unread request
with a reset) and for one longer (the client always closes first).

    .venv/bin/python scripts/keepalive_race.py [--idle 1 75] [--attempts 200] [--pair tiny]

Per server idle timeout S: `rakv serve --http --idle-timeout-s S` on the tiny pair, a background client keeping the
engine busy, and a pooled client (httpx, keep-alive 60 s as `vllm bench serve`'s aiohttp pool) that sends a request,
waits S plus an offset swept over [-30, +30] ms (for S above the client's keep-alive: 1 s), and sends the next on the
same pool. Printed: attempts, requests that failed (connection reset or closed), and the offsets they failed at.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time

import httpx

BODY = {"model": "rakv", "prompt": "def add(a, b):", "max_tokens": 2, "temperature": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(pair: str, idle: float, port: int) -> subprocess.Popen:
    server = subprocess.Popen([".venv/bin/rakv", "serve", "--pair", pair, "--http", f"127.0.0.1:{port}",
                               "--idle-timeout-s", str(idle), "--served-model-name", "rakv", "--quiet"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit("keepalive_race: the server did not start")


def busy(port: int, stop: threading.Event) -> None:
    """Requests back to back on their own connections, so that the engine loop shares the interpreter as under
    load."""
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            try:
                client.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY | {"max_tokens": 16})
            except httpx.HTTPError:
                pass


def race(port: int, idle: float, attempts: int) -> tuple[int, list[float]]:
    wait = idle if idle <= 30 else 1.0
    failed = []
    limits = httpx.Limits(max_keepalive_connections=1, keepalive_expiry=60)
    with httpx.Client(timeout=60, limits=limits) as client:
        for i in range(attempts):
            offset = -0.030 + 0.060 * (i % 61) / 60
            try:
                client.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY).raise_for_status()
            except httpx.HTTPError:
                failed.append(offset)
            time.sleep(max(wait + offset, 0.0))
    return attempts, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=float, nargs="+", default=[1.0, 75.0])
    parser.add_argument("--attempts", type=int, default=200)
    parser.add_argument("--pair", default="tiny")
    args = parser.parse_args()
    for idle in args.idle:
        port = free_port()
        server = start(args.pair, idle, port)
        stop = threading.Event()
        background = threading.Thread(target=busy, args=(port, stop), daemon=True)
        background.start()
        try:
            attempts, failed = race(port, idle, args.attempts)
        finally:
            stop.set()
            background.join(timeout=60)
            server.terminate()
            server.wait(timeout=60)
        where = ", ".join(f"{1e3 * f:+.0f}" for f in failed)
        print(f"server idle timeout {idle:g} s: {len(failed)} of {attempts} requests failed"
              + (f" (sent at the timeout {where} ms)" if failed else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
