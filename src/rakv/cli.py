"""`rakv` command line. Every user-facing failure is a one-line `rakv: error: ...` and exit status 2."""

from __future__ import annotations

import argparse
import json
import sys

from rakv.errors import RakvError


def read_prompts(path: str) -> list[dict]:
    """Read and validate a whole JSONL file before any model work starts."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RakvError(f"cannot read prompts file {path}: {exc.strerror if isinstance(exc, OSError) else exc}") from None
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


def cmd_generate(args) -> None:
    from rakv.cache import PrefixKVStore
    from rakv.decoding import Sampling
    from rakv.engine import Engine, parse_strategy
    from rakv.models import load_pair

    if args.max_new_tokens <= 0:
        raise RakvError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise RakvError("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.cache_budget_mib <= 0:
        raise RakvError("--cache-budget-mib must be positive")
    action = parse_strategy(args.strategy)
    if args.prompt is not None:
        if not args.prompt.strip():
            raise RakvError("empty prompt")
        requests = [{"id": "0", "prompt": args.prompt, "salt": None}]
    else:
        requests = read_prompts(args.prompts)

    pair = load_pair(args.pair, device=args.device, dtype=args.dtype, threads=args.threads)
    engine = Engine(pair, PrefixKVStore(budget_bytes=int(args.cache_budget_mib * (1 << 20))), proposer=args.proposer)
    encoded = [engine.encode(r["prompt"]) for r in requests]
    for request, ids in zip(requests, encoded):  # every length error before any generation
        try:
            engine.check_lengths(len(ids), args.max_new_tokens)
        except RakvError as exc:
            raise RakvError(f"request {request['id']}: {exc}") from None
    sampling = Sampling(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    for request, ids in zip(requests, encoded):
        salt = request["salt"] if request["salt"] is not None else args.salt
        stream = None if args.json else _text_streamer(pair.tokenizer, request["id"])
        result = engine.run(ids, action, args.max_new_tokens, sampling=sampling, salt=salt,
                            ignore_eos=args.ignore_eos, on_token=stream, request_id=request["id"])
        if args.json:
            print(json.dumps(result.to_json()), flush=True)
        else:
            print(f"\n  [{result.prompt_tokens} prompt tokens, {result.hit_tokens} reused, {result.new_tokens} new; "
                  f"r={int(result.reuse)} k={result.k}; accepted {result.accepted}/{result.proposed}; "
                  f"TTFT {result.ttft_s * 1e3:.1f} ms, {result.latency_s:.3f} s, {result.tokens_per_s:.1f} tok/s]",
                  flush=True)


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


def build_parser() -> argparse.ArgumentParser:
    from rakv.engine import FIXED_STRATEGIES, PROPOSERS
    from rakv.models import PAIR_NAMES

    parser = argparse.ArgumentParser(prog="rakv", description="RAKV-ASD: prefix KV reuse + adaptive speculative decoding")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser("generate", help="generate for one prompt or a JSONL file of prompts through one KV store",
                         description="Generate text. --prompts FILE.jsonl holds lines {\"id\": ..., \"prompt\": ..., "
                                     "\"salt\": ... (optional)}; they run in order through one prefix KV store. The "
                                     "whole file is validated first: a malformed line stops the run before any work.")
    gen.add_argument("--pair", required=True, help=f"model pair: {', '.join(PAIR_NAMES)}")
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompts", metavar="FILE.jsonl", help="JSONL file of prompts")
    gen.add_argument("--max-new-tokens", type=int, required=True, metavar="N")
    gen.add_argument("--strategy", required=True,
                     help=f"{', '.join(FIXED_STRATEGIES)}")
    gen.add_argument("--proposer", default="draft", choices=PROPOSERS, help="who drafts for k > 0 (default: draft)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--salt", default=None, help="isolation salt (tenant) of the KV store namespace")
    gen.add_argument("--cache-budget-mib", type=float, default=512)
    gen.add_argument("--ignore-eos", action="store_true", help="generate exactly N tokens")
    gen.add_argument("--json", action="store_true", help="one JSON object per request on stdout")
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--dtype", default="float32")
    gen.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    gen.set_defaults(func=cmd_generate)
    return parser


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
