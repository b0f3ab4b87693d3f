"""scripts/load_http.py's logic: `rakv serve --http` under load, and what must hold of it (docs/serving.md,
"Over HTTP"): every admitted request ends finished or aborted in requests.jsonl, once; the K/V freed when idle;
the resident memory flat after warm-up; no thread or socket leak; throughput at 8 clients that of trace replay.

- The server runs as a subprocess (`start_server`, `stop_server`), sampled from outside (`Sampler`: /proc and
  /metrics) while locust's users (scripts/locustfile_http.py) or this module's own threads (`run_users`, httpx)
  drive it; the users' logs (rakv.bench.load_client) are then held against the server's records (`account`).
- `run_users` and `next_from` also serve rakv.bench.http_overhead: the same requests by trace replay and by B
  closed-loop HTTP clients.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from rakv.bench.load_client import (
    COMPLETIONS_PATH,
    Ask,
    ClientLog,
    Mix,
    Outcome,
    read_logs,
    read_stream,
    read_whole,
    refused_or_failed,
)
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import ServedRunLayout
from rakv.runtime.workloads import dataset_texts
from rakv.serving.records import RequestRecord, read_records
from rakv.serving.trace import generate_trace

ENDED = ("ok", "aborted")  # how an admitted request may end under a load of good requests
LEFT_EARLY = ("cut", "stopped", "client-error")  # the client went away: aborted, or finished before it noticed


# --- the server, from outside ---

@dataclass
class ServerProcess:
    popen: subprocess.Popen
    url: str
    out: Path

    @property
    def pid(self) -> int:
        return self.popen.pid


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(pair: str, strategy: str, out: Path, flags: list[str], timeout_s: float = 600) -> ServerProcess:
    """`rakv serve --http` on a free port, its output in OUT/server.log; returned once /health answers 200."""
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [sys.executable, "-m", "rakv.cli", "serve", "--pair", pair, "--strategy", strategy, "--http",
               f"127.0.0.1:{port}", "--out", str(out), "--quiet", *flags]
    with (out / "server.log").open("w") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(popen, f"http://127.0.0.1:{port}", out)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RakvError(f"the server exited with {popen.returncode} before it was ready (see {out}/server.log)")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(server)
    raise RakvError(f"the server was not ready within {timeout_s:.0f} s (see {out}/server.log)")


def stop_server(server: ServerProcess, timeout_s: float = 120) -> int:
    """SIGTERM (the server drains, then writes requests.jsonl's last lines and summary.json); its exit status."""
    if server.popen.poll() is None:
        server.popen.send_signal(signal.SIGTERM)
    try:
        return server.popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        server.popen.kill()
        server.popen.wait()
        return -9


@dataclass(frozen=True)
class ProcessSample:
    """One look at the server process (/proc) and its /metrics, `at_s` seconds after the load began."""

    at_s: float
    rss_mib: float
    threads: int
    fds: int
    sockets: int
    running: float | None = None
    waiting: float | None = None
    kv_bytes: float | None = None


def look(pid: int, url: str | None, at_s: float) -> ProcessSample:
    proc = Path(f"/proc/{pid}")
    rss_kib = next(int(line.split()[1]) for line in (proc / "status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    links = []
    for fd in (proc / "fd").iterdir():
        try:
            links.append(os.readlink(fd))
        except OSError:  # closed between listing and reading
            pass
    metrics = scrape(url) if url is not None else ServerMetrics()
    return ProcessSample(at_s, rss_kib / 1024, len(list((proc / "task").iterdir())), len(links),
                         sum(link.startswith("socket:") for link in links), metrics.running, metrics.waiting,
                         metrics.kv_bytes)


@dataclass(frozen=True)
class ServerMetrics:
    """What the load test reads of the server's /metrics (rakv.serving.prometheus, under vLLM's names): requests
    running and waiting, K/V bytes held; None where the server did not answer or export it."""

    running: float | None = None
    waiting: float | None = None
    kv_bytes: float | None = None

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


METRIC_NAMES = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
                "kv_bytes": "rakv:kv_bytes"}  # ServerMetrics' fields by their sample names


def scrape(url: str) -> ServerMetrics:
    """/metrics, each sample summed over its labels; empty if the server does not answer."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return ServerMetrics()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return ServerMetrics(**{name: values.get(sample) for name, sample in METRIC_NAMES.items()})


class Sampler:
    """A thread looking at the server every `every_s` while the load runs (OUT/samples.jsonl, beside the records)."""

    def __init__(self, server: ServerProcess, every_s: float):
        self.server, self.every_s = server, every_s
        self.samples: list[ProcessSample] = []
        self.stopping = threading.Event()
        self.start_s = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self.start_s = time.monotonic()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join()

    def _run(self) -> None:
        with (self.server.out / "samples.jsonl").open("w") as fh:  # as they come: a long run can be watched
            while not self.stopping.is_set():
                try:
                    self.samples.append(look(self.server.pid, self.server.url, time.monotonic() - self.start_s))
                except (OSError, StopIteration):  # the process has gone: the checks after say so
                    return
                fh.write(json.dumps(asdict(self.samples[-1])) + "\n")
                fh.flush()
                self.stopping.wait(self.every_s)


def wait_idle(url: str, timeout_s: float = 300) -> ServerMetrics:
    """/metrics once nothing runs or waits (K/V bytes read then); raises if that takes longer than `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if scrape(url).idle:
            time.sleep(0.5)  # one more idle iteration of the engine loop: its gauges settled
            return scrape(url)
        time.sleep(1)
    raise RakvError(f"the server was still busy {timeout_s:.0f} s after the load stopped")


def probe(url: str, log: ClientLog) -> Outcome:
    """One small completion, logged as the users' requests are (so that its record is accounted for). It also lets
    anyio retire the worker threads idle for 10 s, which it does only when it is next asked for one."""
    with httpx.Client(timeout=120) as client:
        seen = send(client, url, Ask(COMPLETIONS_PATH, {"prompt": "Hello", "max_tokens": 2}, None))
    log.write(seen)
    return seen


# --- the clients ---

def send(client: httpx.Client, url: str, ask: Ask) -> Outcome:
    """One streaming request with httpx; a stream to cut is closed after its `cut_after`-th event (leaving the
    `with` closes a response not read to its end: its connection goes, as a browser tab closed mid-answer)."""
    seen = Outcome(ask.path, ask.cut_after)
    try:
        with client.stream("POST", url + ask.path, json=ask.body) as response:
            seen.status = response.status_code
            if response.status_code != 200:
                return refused_or_failed(seen, response.status_code, response.read().decode(errors="replace"))
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                read_stream(response.iter_lines(), seen)
            else:
                read_whole(response.read().decode(), seen)
    except httpx.HTTPError as exc:
        seen.end("client-error", f"{type(exc).__name__}: {exc}")
    return seen


def run_users(url: str, users: int, next_ask: Callable[[int], Ask | None], log: ClientLog,
              timeout_s: float = 600) -> list[Outcome]:
    """`users` threads, each its own connection, sending `next_ask(user)` until it gives None (closed loop: a user
    sends its next request once its previous one has ended). Every outcome is logged and returned."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def user(number: int) -> None:
        with httpx.Client(timeout=timeout_s) as client:
            while (ask := next_ask(number)) is not None:
                seen = send(client, url, ask)
                log.write(seen)
                with lock:
                    outcomes.append(seen)

    threads = [threading.Thread(target=user, args=(n,), name=f"user-{n}") for n in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def run_locust(locustfile: Path, url: str, users: int, spawn_rate: float, duration_s: float, prompts: Path,
               out: Path, options: list[str]) -> int:
    """locust headless as a subprocess (it patches the process it is imported in): its output in OUT/locust.log,
    its statistics in OUT/locust_*.csv, its users' logs in OUT/clients-*.jsonl. Its exit status."""
    command = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", str(users), "-r",
               str(spawn_rate), "-t", f"{duration_s:.0f}s", "--host", url, "--csv", str(out / "locust"),
               "--only-summary", "--prompts", str(prompts), "--log-dir", str(out), *options]
    with (out / "locust.log").open("w") as log:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=duration_s + 300).returncode


# --- what must hold ---

@dataclass
class Accounting:
    """The clients' requests held against the server's records."""

    outcomes: Counter = field(default_factory=Counter)  # the clients' outcomes
    statuses: Counter = field(default_factory=Counter)  # the records' statuses
    admitted: int = 0  # requests the clients saw admitted (an id)
    problems: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return not self.problems


def account(seen: list[Outcome], records: list[RequestRecord]) -> Accounting:
    """Every request a client saw admitted has exactly one record; one that finished for its client is `ok` with as
    many tokens as its usage said; one its client left is `aborted` (or `ok`: it had finished first). A record no
    client saw admitted is one whose client left before its first event: aborted, and no more of them than such
    clients. Nothing else ends `failed` or `refused` under a load of good requests."""
    result = Accounting(Counter(s.outcome for s in seen), Counter(r.status for r in records))
    by_id: dict[str, list[RequestRecord]] = {}
    for record in records:
        by_id.setdefault(record.id, []).append(record)
    problems = result.problems
    problems += [f"{i}: {len(rs)} records" for i, rs in by_id.items() if len(rs) > 1]
    ids = Counter(s.id for s in seen if s.id)
    problems += [f"{i}: seen by {n} clients" for i, n in ids.items() if n > 1]
    result.admitted = len(ids)
    for s in (s for s in seen if s.id):
        mine = by_id.get(s.id, [])
        if not mine:
            problems.append(f"{s.id} ({s.outcome}): no record (lost)")
            continue
        status = mine[0].status
        if s.outcome == "finished" and (status != "ok" or mine[0].new_tokens != s.completion_tokens):
            problems.append(f"{s.id}: finished for its client ({s.completion_tokens} tokens), record "
                            f"{status} ({mine[0].new_tokens} tokens)")
        elif s.outcome in LEFT_EARLY and status not in ENDED:
            problems.append(f"{s.id}: its client left ({s.outcome}), record {status}: {mine[0].error}")
        elif s.outcome not in ("finished", *LEFT_EARLY):
            problems.append(f"{s.id}: the client saw {s.outcome} ({s.error}), record {status}")
    unseen = [r for r in records if r.id not in ids]
    left_before_id = sum(1 for s in seen if not s.id and s.outcome in LEFT_EARLY)
    problems += [f"{r.id}: recorded {r.status} but no client saw it admitted" for r in unseen if r.status != "aborted"]
    if len(unseen) > left_before_id:
        problems.append(f"{len(unseen)} records no client saw admitted, only {left_before_id} clients left before "
                        "their first event")
    problems += [f"a request without an id: {s.outcome} ({s.error})" for s in seen
                 if not s.id and s.outcome not in ("refused", *LEFT_EARLY)]
    return result


@dataclass(frozen=True)
class Resources:
    """The server's memory over the load and its threads / sockets / fds before it and once idle after it."""

    rss_mib: tuple[float, float]  # after warm-up: the least and the most
    rss_spread: float  # (most - least) / least
    before: ProcessSample
    after: ProcessSample
    peak: ProcessSample  # the most threads and sockets seen under load


def resources(samples: list[ProcessSample], warmup_s: float, before: ProcessSample,
              after: ProcessSample) -> Resources:
    warm = [s.rss_mib for s in samples if s.at_s >= warmup_s] or [s.rss_mib for s in samples[-1:]] or [after.rss_mib]
    peak = max(samples or [after], key=lambda s: (s.threads, s.sockets))
    return Resources((min(warm), max(warm)), (max(warm) - min(warm)) / min(warm), before, after, peak)


def settled(server: ServerProcess, settle_s: float, log: ClientLog) -> ProcessSample:
    """The server at rest: `settle_s` for kept-alive connections (--idle-timeout-s) and idle worker threads to
    lapse, one probe request, then a look."""
    time.sleep(settle_s)
    seen = probe(server.url, log)
    if seen.outcome != "finished":
        raise RakvError(f"the server no longer serves a small completion: {seen.outcome} ({seen.error})")
    time.sleep(1)
    return look(server.pid, None, 0.0)


def next_from(asks: list[Ask]) -> Callable[[int], Ask | None]:
    """A closed loop over a fixed list: each user takes the next ask until none is left."""
    pending: queue.Queue = queue.Queue()
    for ask in asks:
        pending.put(ask)

    def take(user: int) -> Ask | None:
        try:
            return pending.get_nowait()
        except queue.Empty:
            return None

    return take


def drawn_until(mix: Mix, deadline: float, seed: int) -> Callable[[int], Ask | None]:
    """A closed loop for a while: each user draws its next ask from `mix` (its own seeded stream) until `deadline`
    (time.monotonic())."""
    streams: dict[int, random.Random] = {}

    def take(user: int) -> Ask | None:
        if time.monotonic() >= deadline:
            return None
        return mix.draw(streams.setdefault(user, random.Random(seed * 1000 + user)))

    return take


def load_prompts(n: int, words: int, seed: int) -> list[str]:
    """Half WikiText-2 paragraphs of `words` words (`rakv trace`'s generator), half HumanEval prompts."""
    prose = [r.prompt for r in generate_trace(dataset_texts("wikitext2"), requests=n - n // 2, rate=1.0,
                                              prompt_words=words, seed=seed)]
    code = [text for _, text in dataset_texts("humaneval")]
    return prose + [code[(seed + i * 7) % len(code)] for i in range(n // 2)]


# --- the run ---

@dataclass(frozen=True)
class LoadSettings:
    pair: str
    strategy: str
    out: Path
    duration_s: float
    sample_s: float = 5.0
    warmup_s: float = 60.0
    settle_s: float = 15.0
    flags: tuple[str, ...] = ()  # more `rakv serve` flags


@dataclass
class LoadRun:
    """What one load run left: the accounting, the resources, /metrics once idle, the exit statuses."""

    accounting: Accounting
    resources: Resources
    idle: ServerMetrics
    samples: list[ProcessSample]
    load_s: float
    server_rc: int
    driver_rc: int


def run_load(settings: LoadSettings, drive: Callable[[ServerProcess], int]) -> LoadRun:
    """Start the server, look at it at rest, `drive` it (the load: locust or threads; its exit status) while
    sampling it, wait for it to idle (/metrics then), look at it at rest again, SIGTERM it; then hold the users'
    logs (OUT/clients-*.jsonl) against its records."""
    out = settings.out
    for stale in out.glob("clients-*.jsonl"):  # a previous run's users
        stale.unlink()
    server = start_server(settings.pair, settings.strategy, out, list(settings.flags))
    log = ClientLog(out / "clients-probe.jsonl")
    try:
        before = settled(server, 0.0, log)
        began = time.monotonic()
        with Sampler(server, settings.sample_s) as sampler:
            driver_rc = drive(server)
        load_s = time.monotonic() - began
        idle = wait_idle(server.url)
        after = settled(server, settings.settle_s, log)
    finally:
        log.close()
        server_rc = stop_server(server)
    accounting = account(read_logs(sorted(out.glob("clients-*.jsonl"))), read_records(ServedRunLayout(out).requests))
    return LoadRun(accounting, resources(sampler.samples, settings.warmup_s, before, after), idle, sampler.samples,
                   load_s, server_rc, driver_rc)
