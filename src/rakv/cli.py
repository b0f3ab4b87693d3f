"""`rakv` command line. Every user-facing failure is a one-line `rakv: error: ...` and exit status 2."""

from __future__ import annotations

import argparse
import json
import sys

from rakv.runtime.errors import RakvError


def read_prompts(path: str) -> list[dict]:
    """Read and validate a whole JSONL file before any model work starts."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else exc
        raise RakvError(f"cannot read prompts file {path}: {reason}") from None
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RakvError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise RakvError(f"{path}:{number}: expected an object with a string \"prompt\"")
        if not row["prompt"].strip():
            raise RakvError(f"{path}:{number}: empty prompt")
        if row.get("salt") is not None and not isinstance(row["salt"], str):
            raise RakvError(f"{path}:{number}: \"salt\" must be a string")
        requests.append({"id": str(row.get("id", number)), "prompt": row["prompt"], "salt": row.get("salt")})
    if not requests:
        raise RakvError(f"{path}: no prompts")
    return requests


ENGINE_FLAGS = ("proposer", "salt", "cache_budget_mib", "reuse_draft", "device", "dtype", "threads", "kernels",
                "precision")
CONTROLLER_FLAGS = ("k_set", "beta", "memory_penalty_s_per_byte", "memory_budget_mib")
SAMPLING_FLAGS = ("temperature", "top_p", "seed", "verify")


def make_engine(args):
    from rakv.runtime.engine_options import EngineOptions
    from rakv.runtime.flags import flag_values

    return EngineOptions(**flag_values(args, EngineOptions, ("pair", *ENGINE_FLAGS))).open()


def controller_config(args):
    """The same ControllerConfig (and checks) as a Hydra run's, from the flags."""
    from dataclasses import replace

    from rakv.runtime.controller import ControllerConfig
    from rakv.runtime.flags import flag_values

    # conf/controller/default.yaml for every setting without a flag (tie_margin, explore_every, match_rate)
    return replace(ControllerConfig.default(), **flag_values(args, ControllerConfig, CONTROLLER_FLAGS))


def sampling_of(args):
    from rakv.runtime.decoding import Sampling
    from rakv.runtime.flags import flag_values

    return Sampling(**flag_values(args, Sampling, SAMPLING_FLAGS))


def cmd_generate(args) -> None:
    from rakv.runtime.actions import ADAPTIVE
    from rakv.runtime.calibration import calibration_for
    from rakv.runtime.controller import Controller
    from rakv.runtime.strategies import action_of, run_strategy

    if args.max_new_tokens <= 0:
        raise RakvError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise RakvError("--temperature must be >= 0 and --top-p in (0, 1]")
    adaptive = args.strategy == ADAPTIVE
    if not adaptive:
        action_of(args.strategy)  # an unknown strategy fails before any model work
    config = controller_config(args)
    if args.prompt is not None:
        if not args.prompt.strip():
            raise RakvError("empty prompt")
        requests = [{"id": "0", "prompt": args.prompt, "salt": None}]
    else:
        requests = read_prompts(args.prompts)

    engine = make_engine(args)
    encoded = [engine.encode(r["prompt"]) for r in requests]
    for request, ids in zip(requests, encoded):  # every length error before any generation
        try:
            engine.check_lengths(len(ids), args.max_new_tokens)
        except RakvError as exc:
            raise RakvError(f"request {request['id']}: {exc}") from None
    try:  # the controller needs a calibration; fixed strategies use one, when present, for their prediction
        table = calibration_for(engine, "never" if args.no_calibrate or not adaptive else "auto")
        controller = Controller(table, config)
    except RakvError:
        if adaptive:
            raise
        controller = None
    sampling = sampling_of(args)
    for request, ids in zip(requests, encoded):
        stream = None if args.json else _text_streamer(engine.pair.tokenizer, request["id"])
        result = run_strategy(engine, args.strategy, ids, args.max_new_tokens, controller=controller,
                              sampling=sampling, salt=request["salt"], ignore_eos=args.ignore_eos, on_token=stream,
                              request_id=request["id"])
        if args.json:
            print(json.dumps(result.to_json()), flush=True)
        else:
            predicted = result.predicted_latency_s
            print(f"\n  [{result.prompt_tokens} prompt tokens, {result.hit_tokens} reused, {result.new_tokens} new; "
                  f"r={int(result.reuse)} k={result.k}; accepted {result.accepted}/{result.proposed}; "
                  f"TTFT {result.ttft_s * 1e3:.1f} ms, {result.latency_s:.3f} s"
                  + (f" (predicted {predicted:.3f} s)" if predicted is not None else "")
                  + f", {result.tokens_per_s:.1f} tok/s]", flush=True)


def cmd_calibrate(args) -> None:
    from rakv.runtime.actions import SPEC_K
    from rakv.runtime.calibration import calibration_for
    from rakv.runtime.costmodel import break_even_alpha, estimate_latency
    from rakv.runtime.workloads import scenario_features, scenario_for_rate

    engine = make_engine(args)
    table = calibration_for(engine, "always" if args.force else "auto")
    if args.json:
        print(json.dumps(table.to_json()))
        return
    print(f"calibration of {engine.pair.name} / proposer {engine.proposer} "
          f"({table.key['hardware']['processor']}, {table.key['hardware']['device']}, "
          f"{table.key['hardware']['threads']} threads; measured in {table.measured_s:.0f} s)")
    if not args.show:
        return
    rows = [("target prefill (s vs tokens)", table.target_prefill), ("target step (s vs context)", table.target_step),
            *((f"target verify k={k} (s vs context)", table.verify[k]) for k in sorted(table.verify)),
            *((f"propose k={k} (s vs context)", table.propose[k]) for k in sorted(table.propose)),
            ("proposer prefill (s vs tokens)", table.proposer_prefill), ("KV copy (s vs reused tokens)", table.kv_copy)]
    print(f"{'cost':<36} {'measured at x: median (MAD / median)':<72} {'adjusted':>8}")
    for name, curve in rows:
        spread = curve.spread or [float("nan")] * len(curve.xs)
        points = ", ".join(f"{int(x)}: {y * 1e3:.2f}ms ({s:.0%})" for x, y, s in zip(curve.xs, curve.ys, spread))
        print(f"{name:<36} {points:<72} {curve.max_rel_error:>8.1%}")
    if table.load_average:
        print(f"machine load (1 min) before / after: {table.load_average[0]:.2f} / {table.load_average[1]:.2f}; "
              "adjusted = the largest change a point needed to make its cost non-decreasing in x")
    print(f"KV bytes per token: target {table.target_kv_bytes_per_token:.0f}, proposer "
          f"{table.proposer_kv_bytes_per_token:.0f}; greedy acceptance alpha = {table.acceptance:.3f} "
          f"over {table.acceptance_rounds} rounds")
    lam = args.memory_penalty_s_per_byte
    lengths = [args.prompt_length] if args.prompt_length else [64, 256, 512]
    draft = engine.draft_key is not None
    print(f"\nbreak-even alpha per k (N = {args.new_tokens} new tokens, reuse {args.reuse_rate:.0%}"
          f"{'; r = 1 reuses the draft state too' if draft else ''}; '-' = never, even at alpha = 1)")
    print(f"{'prompt':>7} {'r':>2} " + " ".join(f"{'k=' + str(k):>7}" for k in SPEC_K)
          + f" {'C(r,0) s':>9} {'best k at alpha=' + format(table.acceptance, '.2f'):>20}")
    for length in lengths:
        features = scenario_features(scenario_for_rate(args.reuse_rate), length, args.new_tokens, draft)
        for reuse in ((False, True) if features.hit_tokens else (False,)):
            alphas = [break_even_alpha(table, features, reuse, k, lam) for k in SPEC_K]
            costs = {k: estimate_latency(table, features, reuse, k, table.acceptance, lam) for k in (0, *SPEC_K)}
            best = min(costs, key=costs.get)
            print(f"{length:>7} {int(reuse):>2} " + " ".join(f"{a:>7.3f}" if a is not None else f"{'-':>7}"
                                                              for a in alphas)
                  + f" {costs[0]:>9.3f} {best:>20}")


def cmd_serve(args) -> None:
    from rakv.runtime.flags import flag_values
    from rakv.serving.server import ServeOptions, serve
    from rakv.serving.trace import read_trace

    options = ServeOptions(**flag_values(args, ServeOptions, SERVE_FLAGS), sampling=sampling_of(args))  # checked once
    if args.http is not None:
        return serve_over_http(args, options)
    if args.out is None:
        raise RakvError("rakv serve --trace needs --out DIR")
    trace = read_trace(args.trace)  # the whole trace is checked before the models load
    engine, parts = served_engine(args, options)
    shown = serve(engine, trace, args.out, options, parts, progress=not args.quiet).to_json()
    print(json.dumps({k: shown[k] for k in SHOWN_SUMMARY if k in shown}))


def served_engine(args, options):
    """The engine and the ServeParts `options` need, for trace replay and --http alike."""
    from rakv.runtime.calibration import calibration_for
    from rakv.serving.server import serve_parts

    engine = make_engine(args)
    recalibrate = "never" if args.no_calibrate else "auto"
    parts = serve_parts(engine, options, lambda e: calibration_for(e, recalibrate), controller_config(args),
                        recalibrate, progress=not args.quiet)
    return engine, parts


def serve_over_http(args, options) -> None:
    """rakv serve --http: the OpenAI-compatible server (rakv.serving.http_server) until SIGTERM or Ctrl-C drains it."""
    from pathlib import Path

    from rakv.runtime.flags import flag_values
    from rakv.serving.http_options import HTTP_FLAGS, HttpOptions
    from rakv.serving.http_server import make_server, parse_address, serve_http

    address = parse_address(args.http)
    http = HttpOptions(**flag_values(args, HttpOptions, HTTP_FLAGS))  # checked before the models load
    if args.check_alone:
        raise RakvError("--check-alone replays a trace; it does not apply to --http")
    engine, parts = served_engine(args, options)
    name = args.served_model_name or engine.pair.target.fingerprint.name

    def ready(where):
        age = process_age_s()
        since = f", ready {age:.1f} s after the process started" if age is not None else ""
        print(f"rakv serve: {name} on http://{where[0]}:{where[1]}/v1 (SIGTERM or Ctrl-C drains and stops{since})",
              flush=True)

    server = make_server(engine, options, address, name, Path(args.out) if args.out else None, parts, http, ready)
    summary = serve_http(server)
    if summary is not None:
        shown = summary.to_json()
        print(json.dumps({k: shown[k] for k in SHOWN_SUMMARY if k in shown}))


def process_age_s() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere): the start-up a server reports when it is
    ready, interpreter, imports and weights included."""
    import os

    try:
        with open("/proc/self/stat") as fh:
            started_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - started_ticks / os.sysconf("SC_CLK_TCK")


SHOWN_SUMMARY = ("completed", "failed", "outputs_equal_alone", "duration_s", "request_throughput", "output_throughput",
                 "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_itl_ms", "goodput", "mean_batch_tokens",
                 "max_concurrency", "prefix_hit_rate", "preemptions", "peak_rss_mib")


def cmd_trace(args) -> None:
    from rakv.runtime.flags import flag_values
    from rakv.runtime.workloads import dataset_texts
    from rakv.serving.trace import TRACE_FLAGS, TraceOptions, generate_trace, write_trace

    settings = flag_values(args, TraceOptions, TRACE_FLAGS)
    trace = generate_trace(dataset_texts(args.dataset), **settings)
    write_trace(args.out, trace, {"generator": "rakv trace", **settings})
    print(f"{args.out}: {len(trace)} requests ({args.kind}, {args.arrivals} at {args.rate:g}/s, seed {args.seed}); "
          f"settings in {args.out}.meta.json")


def _text_streamer(tokenizer, request_id):
    """Print confirmed tokens as they arrive (decoding the whole output each time keeps multi-byte text intact)."""
    tokens, shown = [], [0]
    print(f"[{request_id}] ", end="", flush=True)

    def on_token(token: int) -> None:
        tokens.append(token)
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        print(text[shown[0]:], end="", flush=True)
        shown[0] = len(text)

    return on_token


SERVE_FLAGS = ("strategy", "speculation", "acceptance", "itl_slo_ms", "token_budget", "chunking", "max_batch",
               "kv_budget_mib", "slos_ms", "ignore_eos", "check_alone", "proposers",
               "proposer_choice")


def build_parser() -> argparse.ArgumentParser:
    """`rakv` and its commands: each command's own flags here, the options' flags generated from their dataclasses
    (rakv.runtime.flags: ServeOptions, Sampling, ControllerConfig, EngineOptions, TraceOptions), with conf/ as their
    defaults."""
    parser = argparse.ArgumentParser(prog="rakv",
                                     description="RAKV-ASD: prefix KV reuse + adaptive speculative decoding")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_generate(sub.add_parser(
        "generate", help="generate for one prompt or a JSONL file of prompts through one KV store",
        description="Generate text. --prompts FILE.jsonl holds lines {\"id\": ..., \"prompt\": ..., \"salt\": ... "
                    "(optional)}; they run in order through one prefix KV store. The whole file is validated first: "
                    "a malformed line stops the run before any work."))
    add_calibrate(sub.add_parser(
        "calibrate", help="measure the cost model of a pair on this machine (saved and reused)",
        description="Measure prefill, step, verify, propose and KV-copy costs and the greedy acceptance of the "
                    "pair's proposer; save them keyed by pair and machine."))
    add_serve(sub.add_parser(
        "serve", help="serve a trace of requests arriving over time: continuous batching, chunked prefill, prefix "
                      "reuse, speculation (docs/serving.md)",
        description="Serve a JSONL trace (rakv trace writes one). Writes OUT/requests.jsonl (a line per request as it "
                    "finishes) and OUT/summary.json (vLLM benchmark_serving's names). Defaults: "
                    "conf/serving/default.yaml."))
    add_trace(sub.add_parser(
        "trace", help="write a seeded serving trace from HumanEval or WikiText-2 text",
        description="Write a trace for rakv serve: Poisson or gamma arrivals at a rate; plain requests, shared-prefix "
                    "groups, multi-turn conversations, long-prompt interference, or structured (JSON) output. "
                    "Defaults: conf/serving/default.yaml (trace:); the settings go to OUT.meta.json."))
    return parser


def add_engine_flags(parser, proposer: str = "draft", hidden: tuple[str, ...] = ()) -> None:
    """The engine's flags (EngineOptions), after the command's own; --pair is added first by each command."""
    from rakv.runtime.engine_options import EngineOptions
    from rakv.runtime.flags import add_flags

    add_flags(parser, EngineOptions, ENGINE_FLAGS, {**EngineOptions.conf_defaults(), "proposer": proposer}, hidden)


def add_generate(gen) -> None:
    from rakv.runtime.actions import FIXED_STRATEGIES
    from rakv.runtime.controller import ControllerConfig
    from rakv.runtime.decoding import Sampling
    from rakv.runtime.engine_options import EngineOptions
    from rakv.runtime.flags import add_flags

    add_flags(gen, EngineOptions, ("pair",))
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompts", metavar="FILE.jsonl", help="JSONL file of prompts")
    gen.add_argument("--max-new-tokens", type=int, required=True, metavar="N")
    gen.add_argument("--strategy", required=True,
                     help=f"{', '.join(FIXED_STRATEGIES)}, rakv-asd (the controller; calibrates the pair first "
                          "if this machine has no calibration for it)")
    add_flags(gen, Sampling, SAMPLING_FLAGS)
    gen.add_argument("--ignore-eos", action="store_true", help="generate exactly N tokens")
    gen.add_argument("--json", action="store_true", help="one JSON object per request on stdout")
    add_flags(gen, ControllerConfig, CONTROLLER_FLAGS, vars(ControllerConfig.default()))
    gen.add_argument("--no-calibrate", action="store_true",
                     help="never measure a calibration here; fail if rakv-asd needs one that is missing or stale")
    add_engine_flags(gen)
    gen.set_defaults(func=cmd_generate)


def add_calibrate(cal) -> None:
    from rakv.runtime.controller import ControllerConfig
    from rakv.runtime.engine_options import EngineOptions
    from rakv.runtime.flags import add_flags

    add_flags(cal, EngineOptions, ("pair",))
    cal.add_argument("--force", action="store_true", help="measure again even if a valid calibration exists")
    cal.add_argument("--show", action="store_true", help="print the cost table and break-even alphas")
    cal.add_argument("--json", action="store_true", help="print the calibration as JSON")
    cal.add_argument("--prompt-length", type=int, default=None, help="--show: one prompt length (default 64,256,512)")
    cal.add_argument("--reuse-rate", type=float, default=0.0, help="--show: share of the prompt that hits the store")
    cal.add_argument("--new-tokens", type=int, default=64, help="--show: new tokens per request")
    add_flags(cal, ControllerConfig, ("memory_penalty_s_per_byte",), vars(ControllerConfig.default()))
    add_engine_flags(cal, hidden=("salt", "cache_budget_mib", "reuse_draft"))
    cal.set_defaults(func=cmd_calibrate)


def add_serve(srv) -> None:
    from rakv.runtime.controller import ControllerConfig
    from rakv.runtime.decoding import Sampling
    from rakv.runtime.engine_options import EngineOptions
    from rakv.runtime.flags import add_flags
    from rakv.runtime.paths import conf_file
    from rakv.serving.http_options import HTTP_FLAGS, HttpOptions
    from rakv.serving.http_options import conf_defaults as http_defaults
    from rakv.serving.server import ServeOptions

    serving = conf_file("serving/default.yaml")  # conf/: the one source of defaults
    add_flags(srv, EngineOptions, ("pair",))
    source = srv.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", metavar="FILE.jsonl", help="replay a trace's arrivals")
    source.add_argument("--http", metavar="HOST:PORT",
                        help="serve the OpenAI-compatible API instead (/v1/completions, /v1/chat/completions, "
                             "/metrics; docs/serving.md); bind to 127.0.0.1 unless the host is meant to be reachable")
    srv.add_argument("--out", metavar="DIR", help="where requests.jsonl and summary.json go (required with --trace)")
    srv.add_argument("--served-model-name", default=None, help="--http: the model name clients ask for "
                                                                "(default: the target's, e.g. SmolLM2-135M-Instruct)")
    chunk = srv.add_mutually_exclusive_group()  # a token budget chunks; --no-chunking has none
    add_flags(srv, ServeOptions, SERVE_FLAGS[:4], serving)
    add_flags(chunk, ServeOptions, SERVE_FLAGS[4:6], serving)
    add_flags(srv, ServeOptions, SERVE_FLAGS[6:], serving)
    add_flags(srv, Sampling, SAMPLING_FLAGS)
    add_flags(srv, ControllerConfig, CONTROLLER_FLAGS, vars(ControllerConfig.default()),
              hidden=CONTROLLER_FLAGS[1:])
    add_flags(srv.add_argument_group("--http limits"), HttpOptions, HTTP_FLAGS, http_defaults())
    srv.add_argument("--no-calibrate", action="store_true", help="rakv-asd: fail rather than calibrate here")
    srv.add_argument("--quiet", action="store_true", help="no progress bar")
    add_engine_flags(srv, proposer=serving.proposer)
    srv.set_defaults(func=cmd_serve)


def add_trace(tr) -> None:
    from rakv.runtime.flags import add_flags
    from rakv.serving.trace import TRACE_FLAGS, TraceOptions

    tr.add_argument("--out", required=True, metavar="FILE.jsonl")
    add_flags(tr, TraceOptions, TRACE_FLAGS, TraceOptions.conf_defaults())  # conf/: the one source of defaults
    tr.set_defaults(func=cmd_trace)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        args.func(args)
    except RakvError as exc:
        print(f"rakv: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rakv: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
