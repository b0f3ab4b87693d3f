"""What the HTTP layer costs (scripts/load_http.py; docs/serving.md, "Over HTTP"): the same requests served by
trace replay and over HTTP, output tokens per second each.

- Replay: `rakv serve --trace` of N requests all arriving at once, `--max-batch B --ignore-eos`: B requests run
  at a time, a waiting one admitted as soon as one finishes. Its wall time: the first arrival to the last
  completion, on the serving clock (requests.jsonl).
- HTTP: a fresh `rakv serve --http` with the same flags, B closed-loop clients (threads, httpx) sending the same N
  requests (`ignore_eos`, the same max_tokens, streamed as `vllm bench serve` streams): B in flight at a time. Its
  wall time: the first send to the last stream's end, on the clients' clock.
Every request yields exactly max_tokens tokens either way, so the two differ only in what serving them over HTTP
costs (handlers, tokenising, SSE, the client's own share of the CPU).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rakv.bench.load_client import COMPLETIONS_PATH, Ask, ClientLog
from rakv.bench.load_http import next_from, run_users, start_server, stop_server
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import ServedRunLayout
from rakv.runtime.workloads import dataset_texts
from rakv.serving.records import read_records
from rakv.serving.trace import TraceRequest, generate_trace, write_trace


@dataclass(frozen=True)
class Throughput:
    requests: int  # finished
    tokens: int  # their output tokens
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def same_prompts(n: int, words: int, seed: int) -> list[str]:
    """N WikiText-2 prompts of `words` words (`rakv trace`'s plain generator)."""
    return [r.prompt for r in generate_trace(dataset_texts("wikitext2"), requests=n, rate=1.0, prompt_words=words,
                                             seed=seed)]


def replay_throughput(pair: str, strategy: str, prompts: list[str], max_tokens: int, batch: int, out: Path,
                      flags: list[str]) -> Throughput:
    """`rakv serve --trace`: every prompt arriving at 0, `--max-batch batch --ignore-eos`."""
    out.mkdir(parents=True, exist_ok=True)
    trace = [TraceRequest(id=f"r{i}", arrival_s=0.0, prompt=p, max_new_tokens=max_tokens) for i, p in
             enumerate(prompts)]
    served = ServedRunLayout(out)
    write_trace(served.trace, trace, {"generator": "scripts/load_http.py", "requests": len(trace)})
    command = [sys.executable, "-m", "rakv.cli", "serve", "--pair", pair, "--strategy", strategy, "--trace",
               str(served.trace), "--max-batch", str(batch), "--ignore-eos", "--out", str(out), "--quiet",
               *flags]
    with (out / "server.log").open("w") as log:
        if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            raise RakvError(f"trace replay failed (see {out}/server.log)")
    ok = [r for r in read_records(served.requests) if r.ok]
    if len(ok) != len(prompts):
        raise RakvError(f"trace replay finished {len(ok)} of {len(prompts)} requests (see {out})")
    wall = max(r.arrival_s + r.e2el_s for r in ok) - min(r.arrival_s for r in ok)
    return Throughput(len(ok), sum(r.new_tokens for r in ok), wall)


def http_throughput(pair: str, strategy: str, prompts: list[str], max_tokens: int, batch: int, out: Path,
                    flags: list[str], stream: bool = True) -> Throughput:
    """A fresh `rakv serve --http` with replay's flags; `batch` closed-loop clients send the same requests."""
    server = start_server(pair, strategy, out, ["--max-batch", str(batch), "--ignore-eos", *flags])
    body = {"max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    log = ClientLog(out / "clients.jsonl")
    try:
        outcomes = run_users(server.url, batch, next_from([Ask(COMPLETIONS_PATH, {**body, "prompt": p}, None)
                                                           for p in prompts]), log)
    finally:
        log.close()
        stop_server(server)
    done = [o for o in outcomes if o.outcome == "finished" and o.completion_tokens == max_tokens]
    if len(done) != len(prompts):
        bad = next(o for o in outcomes if o not in done)
        raise RakvError(f"over HTTP {len(done)} of {len(prompts)} requests finished with {max_tokens} tokens; "
                        f"e.g. {bad.outcome}: {bad.error}")
    wall = max(o.ended_s for o in outcomes) - min(o.sent_s for o in outcomes)
    return Throughput(len(done), sum(o.completion_tokens for o in done), wall)
