"""Load test of `rakv serve --http` (issue 39's goals; docs/serving.md, "Over HTTP"), printing its figures and a
verdict per goal; exits 1 when one is missed.

    .venv/bin/python scripts/load_http.py [--pair smollm2] [--strategy ar] [--users 64] [--duration 300]
        [--cut-share 0.2] [--repeats 3] [--out results/load_http]
    .venv/bin/python scripts/load_http.py --pair tiny --duration 30 --repeats 1     # a quick run

1. Load: a fresh `rakv serve --http` (a subprocess) driven by locust headless (scripts/locustfile_http.py, run as a
   subprocess: it patches the process it is imported in), --users users each looping streamed completions (a
   --chat-share of chat completions) of WikiText-2 and HumanEval prompts, max_tokens in --max-tokens, a --cut-share
   of the streams closed by the client after their first event or two. Every --sample-s the server's RSS, threads,
   fds and sockets (/proc) and /metrics are sampled. Then: idle (K/V bytes read), a rest of --settle-s, SIGTERM.
   Checked: every request a client saw admitted has exactly one record in requests.jsonl, ok or aborted (a cut one
   aborted, or ok if it had finished first; a finished one ok with the tokens its usage said), none lost, none
   duplicated; rakv:kv_bytes 0 once idle; RSS after --warmup-s flat; threads, sockets and fds at rest after the
   load no more than before it (plus a small slack); the server drains and exits 0 on SIGTERM.
2. Throughput: --throughput-requests WikiText-2 prompts, each exactly --throughput-tokens tokens (ignore_eos), by
   trace replay (all arriving at once, --max-batch --clients) and over HTTP (--clients closed-loop clients against
   a fresh server with the same flags), interleaved --repeats times; judged: the median HTTP / replay ratio of
   output tokens/s.
The goals, with their thresholds, are listed below (rakv.bench.goals); goals.json keeps each one's verdict.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from rakv.bench.goals import (
    HTTP_OVER_REPLAY,
    IDLE_KV_BYTES,
    LOAD_GOALS,
    LOAD_PROBLEMS,
    RSS_SPREAD,
    SOCKET_GROWTH,
    THREAD_GROWTH,
    UNCLEAN_EXIT,
    Goal,
    goals_text,
    judge,
)
from rakv.bench.http_overhead import http_throughput, replay_throughput, same_prompts
from rakv.bench.load_client import ClientLog, Mix
from rakv.bench.load_http import LoadRun, LoadSettings, drawn_until, load_prompts, run_load, run_locust, run_users
from rakv.runtime.actions import AR
from rakv.runtime.errors import RakvError

LOCUSTFILE = Path(__file__).with_name("locustfile_http.py")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, epilog=goals_text(LOAD_GOALS),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", default="smollm2")
    parser.add_argument("--strategy", default=AR)
    parser.add_argument("--serve-flag", action="append", default=[], metavar="FLAG",
                        help="one more `rakv serve` flag for every server (repeat; e.g. --serve-flag=--max-batch=16)")
    parser.add_argument("--client", choices=("locust", "threads"), default="locust",
                        help="the load's users: locust's (default) or this script's threads (httpx)")
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--spawn-rate", type=float, default=16.0, help="users started per second")
    parser.add_argument("--duration", type=float, default=300.0, metavar="S")
    parser.add_argument("--cut-share", type=float, default=0.2)
    parser.add_argument("--chat-share", type=float, default=0.2)
    parser.add_argument("--max-tokens", type=int, nargs=2, default=[32, 64], metavar=("LOW", "HIGH"))
    parser.add_argument("--prompts", type=int, default=200, help="distinct prompts the users draw from")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=60.0, help="RSS is judged from here to the end")
    parser.add_argument("--settle-s", type=float, default=15.0, help="rest after idle before threads are counted")
    parser.add_argument("--clients", type=int, default=8, help="throughput: concurrent clients = --max-batch")
    parser.add_argument("--throughput-requests", type=int, default=64)
    parser.add_argument("--throughput-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-stream", action="store_true", help="throughput: whole completions, not streamed")
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/load_http")
    return parser.parse_args()


def load(args, out: Path) -> LoadRun:
    prompts = load_prompts(args.prompts, 64, args.seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "prompts.json").write_text(json.dumps(prompts))
    settings = LoadSettings(args.pair, args.strategy, out, args.duration, args.sample_s, args.warmup_s,
                            args.settle_s, tuple(args.serve_flag))

    def locust(server) -> int:
        return run_locust(LOCUSTFILE, server.url, args.users, args.spawn_rate, args.duration, out / "prompts.json",
                          out, ["--cut-share", str(args.cut_share), "--chat-share", str(args.chat_share),
                                "--max-tokens", *map(str, args.max_tokens), "--seed", str(args.seed)])

    def threads(server) -> int:
        mix = Mix(prompts, args.chat_share, args.cut_share, tuple(args.max_tokens))
        log = ClientLog(out / "clients-threads.jsonl")
        try:
            run_users(server.url, args.users, drawn_until(mix, time.monotonic() + args.duration, args.seed), log)
        finally:
            log.close()
        return 0

    return run_load(settings, locust if args.client == "locust" else threads)


def print_load(args, run: LoadRun) -> list[tuple[Goal, float | None]]:
    """The load's figures, and each of its goals with its measured value."""
    a, r, samples = run.accounting, run.resources, run.samples
    sent = sum(a.outcomes.values())
    in_flight = max(((s.running or 0) + (s.waiting or 0) for s in samples), default=0)
    print(f"load: {args.users} users ({args.client}) for {run.load_s:.0f} s, pair {args.pair}, strategy "
          f"{args.strategy}; client exit {run.driver_rc}, server exit {run.server_rc}")
    print(f"  requests sent {sent}: " + ", ".join(f"{k} {v}" for k, v in sorted(a.outcomes.items()))
          + f" (cut share {a.outcomes['cut'] / max(sent, 1):.1%})")
    print(f"  records {sum(a.statuses.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(a.statuses.items()))
          + f"; admitted as the clients saw it {a.admitted}; most in flight at a sample {in_flight:.0f}")
    for problem in a.problems[:10]:
        print(f"  problem: {problem}")
    print(f"  idle: rakv:kv_bytes {run.idle.kv_bytes}, running {run.idle.running}, waiting {run.idle.waiting}")
    print(f"  RSS after {args.warmup_s:.0f} s: {r.rss_mib[0]:.0f}-{r.rss_mib[1]:.0f} MiB (spread {r.rss_spread:.1%}); "
          f"at rest before {r.before.rss_mib:.0f}, after {r.after.rss_mib:.0f} MiB")
    minutes = {int(s.at_s // 60): s.rss_mib for s in samples}  # the last sample of each minute
    print("  RSS at the end of each minute: " + ", ".join(f"{m + 1}: {v:.0f}" for m, v in sorted(minutes.items()))
          + " MiB")
    print(f"  threads {r.before.threads} before, {r.peak.threads} at most, {r.after.threads} after; sockets "
          f"{r.before.sockets} / {r.peak.sockets} / {r.after.sockets}; fds {r.before.fds} / {r.peak.fds} / "
          f"{r.after.fds}")
    return [(LOAD_PROBLEMS, len(a.problems) + (a.admitted == 0)), (IDLE_KV_BYTES, run.idle.kv_bytes),
            (RSS_SPREAD, r.rss_spread), (THREAD_GROWTH, r.after.threads - r.before.threads),
            (SOCKET_GROWTH, max(r.after.sockets - r.before.sockets, r.after.fds - r.before.fds)),
            (UNCLEAN_EXIT, int(run.server_rc != 0))]


def throughput(args, out: Path) -> list[tuple[Goal, float | None]]:
    """Replay and HTTP interleaved --repeats times; the median ratio."""
    prompts = same_prompts(args.throughput_requests, 64, args.seed)
    flags, ratios = list(args.serve_flag), []
    print(f"throughput: {len(prompts)} requests x {args.throughput_tokens} tokens (ignore_eos), {args.clients} at a "
          f"time, {'whole' if args.no_stream else 'streamed'} over HTTP")
    for i in range(args.repeats):
        replay = replay_throughput(args.pair, args.strategy, prompts, args.throughput_tokens, args.clients,
                                   out / f"replay-{i}", flags)
        http = http_throughput(args.pair, args.strategy, prompts, args.throughput_tokens, args.clients,
                               out / f"http-{i}", flags, stream=not args.no_stream)
        ratios.append(http.tokens_per_s / replay.tokens_per_s)
        print(f"  run {i}: replay {replay.tokens_per_s:7.1f} tok/s ({replay.tokens} in {replay.wall_s:.1f} s), HTTP "
              f"{http.tokens_per_s:7.1f} tok/s ({http.tokens} in {http.wall_s:.1f} s): ratio {ratios[-1]:.3f}")
    median = statistics.median(ratios)
    print(f"  median ratio HTTP / replay {median:.3f} at {args.clients} clients")
    return [(HTTP_OVER_REPLAY, median)]


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    measured: list[tuple[Goal, float | None]] = []
    began = time.monotonic()
    try:
        if not args.skip_load:
            measured += print_load(args, load(args, out / "load"))
        if not args.skip_throughput:
            measured += throughput(args, out / "throughput")
    except RakvError as exc:
        print(f"load_http: error: {exc}", file=sys.stderr)
        return 2
    print(f"goals ({time.monotonic() - began:.0f} s in all):")
    verdicts = {}
    for goal, value in measured:
        verdicts[goal.line()] = judge(goal, value)
        shown = "not measured" if value is None else f"{value:g}"
        print(f"  {'met   ' if verdicts[goal.line()] == 'met' else 'MISSED'} {goal.line()}: {shown}")
    (out / "goals.json").write_text(json.dumps({line: verdict == "met" for line, verdict in verdicts.items()},
                                               indent=1) + "\n")
    return 0 if all(verdict == "met" for verdict in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
