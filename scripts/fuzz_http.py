"""Fuzz `rakv serve --http` (docs/serving.md, "Over HTTP"): schemathesis over the server's own OpenAPI schema, then
the bad inputs sent raw, then a drain and the records checked.

    .venv/bin/python scripts/fuzz_http.py [--examples 1000] [--concurrency 4] [--out DIR]

Starts `rakv serve --pair tiny --strategy joint-k2 --http 127.0.0.1:0 --out DIR/server` as a subprocess, then:
1. >= --examples property-based requests over every operation of its /openapi.json (positive and negative data;
   a generated max_tokens the server would admit is capped, rakv.bench.fuzz_http.CAP_TOKENS), each with a 60 s
   client timeout, checked: no 5xx but a 503 with Retry-After, answers conforming to the schema, /health 200 every
   100 answers;
2. each bad input (out-of-range seed, temperature 1e-40, Infinity / NaN, huge / negative / non-numeric
   Content-Length, 10^6-token prompts) raw: a 4xx (malformed framing: or closed), then a good request served;
3. /health 200, a greedy request served, SIGTERM: the server exits 0 after draining, requests.jsonl has one line
   per request that reached the engine (as /metrics counted them), none twice, summary.json written.
Prints the figures and each goal's verdict (rakv.bench.goals.fuzz_goals: the generated requests, engine deaths, hung
requests, 5xx other than 503, and what this script checks besides); exits 1 if a goal is missed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rakv.bench.fuzz_http import (
    CAP_TOKENS,
    TIMEOUT_S,
    bad_inputs,
    check_records,
    ended_requests,
    fuzz,
    generate,
    good_request,
    health,
    load_schema,
)
from rakv.bench.goals import fuzz_goals, goals_text, judge
from rakv.runtime.actions import joint
from rakv.runtime.errors import RakvError

EXAMPLES = 1000  # --examples' default: the generated requests the goal asks for
READY = re.compile(r"on http://([^/\s]+):(\d+)/v1")


@dataclass
class Ending:
    """What the server did after the fuzzing: /health, a greedy request, its exit on SIGTERM, its records."""

    health_after: int | None
    greedy_after: int | None
    exit_status: int | None = None
    record_problems: list[str] = field(default_factory=list)
    ended: int = 0  # requests /metrics counted as ended

    def failures(self) -> int:
        return sum([self.health_after != 200, self.greedy_after != 200, self.exit_status != 0,
                    bool(self.record_problems)])

    def lines(self) -> list[tuple[str, object]]:
        return [("/health after", self.health_after), ("greedy request after", self.greedy_after),
                ("server exit status after SIGTERM", self.exit_status),
                ("requests.jsonl / summary.json", "; ".join(self.record_problems)
                 or f"{self.ended} lines, ids unique, summary written")]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, epilog=goals_text(list(fuzz_goals(EXAMPLES).values())),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=EXAMPLES, help="generated requests at least")
    parser.add_argument("--concurrency", type=int, default=4, help="clients sending the generated requests")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis's seed")
    parser.add_argument("--pair", default="tiny")
    parser.add_argument("--strategy", default=joint(2))
    parser.add_argument("--out", default="results/fuzz_http")
    parser.add_argument("--start-timeout-s", type=float, default=600)
    return parser.parse_args()


def start_server(args, out: Path) -> tuple[subprocess.Popen, str, tuple[str, int]]:
    """`rakv serve --http` on a free port; returns when it says where it listens and /health answers 200."""
    log = out / "server.log"
    command = [sys.executable, "-m", "rakv.cli", "serve", "--pair", args.pair, "--strategy", args.strategy,
               "--http", "127.0.0.1:0", "--out", str(out / "server"), "--quiet"]
    server = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=os.environ.copy())
    deadline = time.monotonic() + args.start_timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RakvError(f"the server exited with {server.returncode} before it was ready (see {log})")
        found = READY.search(log.read_text())
        if found:
            address = (found.group(1), int(found.group(2)))
            base_url = f"http://{address[0]}:{address[1]}"
            if health(base_url) == 200:
                return server, base_url, address
        time.sleep(0.5)
    server.kill()
    raise RakvError(f"the server was not ready within {args.start_timeout_s:.0f} s (see {log})")


def stop_server(server: subprocess.Popen) -> int | None:
    """SIGTERM, then its exit status (None: it did not exit within the drain and a margin)."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.kill()
        return None


def print_figures(tally, generated: int, bad: list, final: Ending, wall_s: float) -> None:
    print(f"\n{'generated requests':<40} {generated}")
    print(f"{'  sent and answered or timed out':<40} {tally.sent}")
    print(f"{'  max_tokens capped to ' + str(CAP_TOKENS):<40} {tally.capped}  (generated values in "
          f"({CAP_TOKENS}, context]; beyond the context sent as generated)")
    print(f"{'  answered':<40} {'positive':>9} {'negative':>9} {'total':>7}")
    for status in sorted({status for _, status in tally.statuses}, key=str):
        counts = [tally.statuses[mode, status] for mode in ("positive", "negative")]
        print(f"{'  ' + str(status):<40} {counts[0]:>9} {counts[1]:>9} {sum(counts):>7}")
    print("  positive data refused, by reason (the schema admits what the server refuses):")
    for (status, reason), count in tally.refusals.most_common(8):
        print(f"    {count:>5} x {status} {reason}")
    print(f"{'5xx other than 503 with Retry-After':<40} {len(tally.server_errors)}")
    print(f"{'hung (no answer within ' + format(TIMEOUT_S, 'g') + ' s)':<40} {len(tally.hung)}")
    print(f"{'dropped (closed without an answer)':<40} {len(tally.dropped)}")
    print(f"{'not conforming to the schema':<40} {len(tally.nonconforming)}")
    print(f"{'engine deaths (/health not 200)':<40} {tally.engine_deaths} of {len(tally.health)} checks")
    for kind in ("server_errors", "hung", "dropped", "nonconforming"):
        for line in getattr(tally, kind)[:5]:
            print(f"  {kind}: {line}")
    print(f"\n{'bad input':<40} {'answer':<26} {'took s':>7} {'good request after':>19}")
    for result, ok in bad:
        print(f"{result.name:<40} {str(result.outcome):<26} {result.took_s:7.2f} {str(result.served_after):>19}"
              + ("" if ok else "   <- not as it must be"))
    print()
    for name, value in final.lines():
        print(f"{name:<40} {value}")
    print(f"{'wall time':<40} {wall_s:.0f} s")


def goals(args, generated: int, tally, bad: list, final: Ending) -> dict[str, str]:
    """The issue's goals (the first four) and what this script checks besides (rakv.bench.goals.fuzz_goals), each
    judged: its line (the goal with its threshold) and its verdict."""
    counted = {"generated": generated, "deaths": tally.engine_deaths, "hung": len(tally.hung),
               "server_errors": len(tally.server_errors), "faults": len(tally.dropped) + len(tally.nonconforming),
               "bad_inputs": sum(not ok for _, ok in bad), "ending": final.failures()}
    return {goal.line(): judge(goal, counted[name]) for name, goal in fuzz_goals(args.examples).items()}


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        server, base_url, address = start_server(args, out)
    except RakvError as exc:
        print(f"fuzz_http: {exc}", file=sys.stderr)
        return 1
    ready = time.monotonic()
    try:
        schema = load_schema(base_url)
        cases = generate(schema, args.examples, args.seed)
        print(f"server ready in {ready - began:.0f} s; {len(cases)} cases generated in "
              f"{time.monotonic() - ready:.0f} s; sending ({args.concurrency} clients)", flush=True)
        tally = fuzz(base_url, cases, args.concurrency)
        bad = bad_inputs(base_url, address)
        final = Ending(health(base_url), good_request(base_url))
        final.ended = ended_requests(base_url)
    finally:
        returncode = stop_server(server)
    final.exit_status = returncode
    final.record_problems = check_records(out / "server", final.ended, tally.answered)
    print_figures(tally, len(cases), bad, final, time.monotonic() - began)
    met = goals(args, len(cases), tally, bad, final)
    print()
    for goal, verdict in met.items():
        print(f"{'met' if verdict == 'met' else 'MISSED':<7} {goal}")
    return 0 if all(verdict == "met" for verdict in met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
