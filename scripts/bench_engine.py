"""Engine benchmark on one pair, side by side with transformers (and llama.cpp when installed) in one run; prints
ratios. The measurements are rakv.bench.engine's.

    .venv/bin/python scripts/bench_engine.py [--pair smollm2] [--kernels compact] [--new-tokens 64] [--repeats 3]
        [--json]
    .venv/bin/python scripts/bench_engine.py --gemm   # only the GEMM table (rakv.runtime.kernels.cpp) by row count
    .venv/bin/python scripts/bench_engine.py --load   # only memory and start-up (fresh processes)
    .venv/bin/python scripts/bench_engine.py --draft-reuse   # only the draft's prefill with and without its stored
                                                             # state
    .venv/bin/python scripts/bench_engine.py --precision-peer [--out PATH]   # only ours at fp32 / int8 / q4_1
        # beside llama.cpp on the same GGUF, 1 and 2 threads, with the floors; written as a record (default
        # data/reference/peer/bench_engine/precision-<cpu>.json) that docs/engine.md's "Precision" tables are
        # rendered from (scripts/write_precision_table.py)
    ./scripts/setup_llama_cpp_peer.sh   # optional: llama.cpp beside us in .venv-llama (builds from source, 10-30 min)

`--precision` runs our target at fp32, int8 or q4_1 (rakv.runtime.models.PRECISIONS) in every measurement; the
transformers side stays fp32.

Our engine runs the pair with `--kernels` (rakv.runtime.kernels; default compact); transformers' `generate` and
assisted generation run a second copy of the pair loaded with stock kernels, i.e. transformers as shipped. With
`llama-cpp-python` installed, llama.cpp decodes the same prompt greedily on the shipped Q4_1 GGUF and on that file
converted to F32 (the same dequantised fp32 weights as our target), and prefills the same ~512-token prompt.
Printed, each a median of interleaved repeats, with its goal and verdict beside it (the goals are listed below,
from rakv.bench.goals, which judges them):
- AR and spec-k4 ms/token (prefill included), ours / transformers (identical outputs required); ours / llama.cpp F32:
  decode ms/token after the first token and prefill tokens/s of the same ~512 tokens;
- the GEMM by row count (1-512 rows through the pair's own packed projections, fp32 target and int8 draft): ms,
  / one row, GFLOPS against the machine's FMA peak measured by the kernels themselves, GB/s of weights;
- the floor (target weight bytes / streaming bandwidth); the int8 draft's step against its floor and against the
  target step, beside the ratio of their weight bytes;
- verify(k + 1) / one step for k in 1, 2, 4, 6, 8;
- a batched step of 1, 2, 4, 8, 16, 32 requests (each its own 256-token context) / one request, and the same steps
  by kernel (GEMM, attention, the rest) beside their floor (weights and the rows'
  K/V at the streaming bandwidth, or FLOPs at the FMA peak); each of these ratio goals and the draft's judged met,
  missed, or out of reach at this baseline where even the step's floor over the measured baseline step (one
  request; the target) misses it (rakv.bench.roofline.goal_verdict), the floors' own ratio beside as context; a
  32-token prefill chunk beside 4 decoding requests / the 4 decodes alone;
- prefill of 64, 128, 256 and 512 tokens, target and draft, against the previous engine's calibration
  (data/reference/offline-fast-kernels, measured on the reference machine);
- TTFT with the prefix store (an exact repeat / cold, a 50 % partial hit / cold, ~512 tokens);
- the draft's prefill before a joint-k4 request's first round, with the draft's state in the store and without
  (an exact repeat, a 50 % partial hit);
- memory: the peak increase while each generation runs (fresh processes), and a fresh process's whole peak
  resident set against the bytes of the weights it holds plus its K/V (met or missed), the same peak less an
  interpreter with torch imported beside it (information, not judged);
- start-up: a fresh `rakv generate` and a fresh `rakv serve --http` to their first token, the packed weights' cache
  cold and warm (rakv.runtime.gguf_weights).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rakv.bench.engine import (
    SIDES,
    bench,
    draft_reuse_rows,
    gemm_table,
    load_sides,
    make_sides,
    precision_peer_file,
    reuse_prompts,
)
from rakv.bench.engine_load import load_report, peak_increase_mib, rss_probe
from rakv.bench.engine_report import (
    DraftReuse,
    EngineReport,
    GemmTable,
    LoadReport,
    MemoryRow,
    PrecisionPeerFile,
    PrecisionPeerTable,
    StartupRow,
)
from rakv.bench.goals import (
    AR_OVER_FLOOR,
    BATCH_GOALS,
    CHUNK_BESIDE_DECODES,
    DRAFT_OVER_FLOOR,
    DRAFT_OVER_TARGET,
    DRAFT_REUSE_EXACT,
    ENGINE_GOALS,
    GENERATION_GOALS,
    LLAMA_CPP_DECODE,
    LLAMA_CPP_PREFILL,
    MEMORY,
    PRECISION_PEER_GOALS,
    PREFILL_FASTER,
    SERVE_STARTUP_WARM,
    STARTUP_WARM,
    TTFT_EXACT,
    TTFT_PARTIAL,
    VERIFY_JUDGED_UP_TO_K,
    VERIFY_OVER_STEP,
    Goal,
    goals_text,
    judge,
)
from rakv.bench.options import EngineBenchOptions, add_flags, options_from
from rakv.bench.roofline import format_row_costs
from rakv.runtime.actions import AR, JOINT_K4, SPEC_K, SPEC_K4, Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import to_json, write_record
from rakv.runtime.models import load_pair
from rakv.runtime.workloads import load_humaneval


def judged(goal: Goal, value: float | None, baseline: float = 1.0, limit: float | None = None) -> str:
    """The goal's text and its verdict on `value`, as printed beside a measured value."""
    return f"{goal.text()}: {judge(goal, value, baseline, limit)}"


def print_draft_reuse(rows: DraftReuse, tokens: int) -> None:
    for case, row in rows.cases():
        goal = f", {judged(DRAFT_REUSE_EXACT, row.ratio)}" if row is rows.exact_repeat else ""
        print(f"joint-k4 draft prefill before the first round, {case} ({tokens} tokens): with the draft's "
              f"state in the store {row.with_ms:.2f} ms, without {row.without_ms:.1f} ms (ratio "
              f"{row.ratio:.3f}{goal}); draft positions reused {row.draft_hit_tokens}")


def print_gemm_table(table: GemmTable) -> None:
    print(f"GEMM by row count (kernels.cpp, {table.threads} threads; fp32 FMA peak measured "
          f"{table.fma_peak_gflops:.0f} GFLOPS): rows: ms (/ one row, GFLOPS or int8 GOPS, GB/s of weights)")
    for name, side in table.sides.items():
        print(f"  {name} ({side.weight_bytes / 1e6:.0f} MB): " + "; ".join(
            f"{r.rows}: {r.ms:.1f} ({r.over_one:.2f}x, {r.gflops:.0f}"
            + (f" = {r.gflops / table.fma_peak_gflops:.0%} of peak" if name == "fp32" else "")
            + f", {r.gb_s:.0f})" for r in side.rows))


def parse_args(argv=None) -> tuple[EngineBenchOptions, argparse.Namespace]:
    """The measurement's options, and the script's own flags (what to run and print)."""
    parser = argparse.ArgumentParser(description=__doc__, epilog=goals_text(ENGINE_GOALS + PRECISION_PEER_GOALS),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(parser, EngineBenchOptions)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--gemm", action="store_true", help="only the GEMM table by row count (kernels.cpp)")
    parser.add_argument("--draft-reuse", action="store_true",
                        help="only the draft's prefill before a joint-k4 request's first round, with and without "
                             "the draft's state in the store")
    parser.add_argument("--precision-peer", action="store_true",
                        help="only our target at each precision beside llama.cpp on the same GGUF (decode, prefill "
                             "of --long-prompt-tokens, 1 and 2 threads) with each precision's floor")
    parser.add_argument("--out", type=Path, default=None,
                        help="with --precision-peer: the record's path (default: data/reference/peer/bench_engine/"
                             "precision-<cpu label>.json, rakv.runtime.run_layout.PeerLayout.precision)")
    parser.add_argument("--load", action="store_true",
                        help="only memory and start-up (fresh processes: peak RSS; `rakv generate` to its first "
                             "token with the packed weights' cache cold and warm)")
    parser.add_argument("--probe", choices=(*SIDES, "rss"),
                        help=argparse.SUPPRESS)  # internal: one memory measurement in a fresh process
    args = parser.parse_args(argv)
    return options_from(EngineBenchOptions, args), args


def show(args, record, printer) -> int:
    """`record` as one JSON object (--json) or through `printer`."""
    print(json.dumps(to_json(record))) if args.json else printer(record)
    return 0


def print_precision_peer(table: PrecisionPeerTable) -> None:
    print(f"{table.pair} at each precision beside llama.cpp on the same GGUF (q4_1: the shipped file; fp32: its F32 "
          f"conversion): decode after the first token ({table.new_tokens} tokens), prefill of {table.prefill_tokens} "
          f"tokens, medians of {table.repeats}")
    print("floors (the bytes a decode step streams / " f"{table.bandwidth_gb_s:.1f} GB/s measured): " + ", ".join(
        f"{f.precision} {f.weight_bytes / 1e6:.0f} MB = {f.floor_ms:.2f} ms" for f in table.floors))
    print(f"{'who':<10} {'precision':<9} {'threads':>7} {'decode ms/tok':>13} {'/ floor':>8} {'prefill tok/s':>13}")
    for s in table.sides:
        if s.error:  # (an absent field is falsy)
            print(f"{s.who:<10} {s.precision:<9} {s.threads:>7} not measured: {s.error}")
            continue
        print(f"{s.who:<10} {s.precision:<9} {s.threads:>7} {s.decode_ms_per_token:>13.2f} "
              f"{s.decode_over_floor:>8.2f} {s.prefill_tokens_per_s:>13.0f}")
    print("draft step / target step at 256 positions: " + "; ".join(
        f"{d.precision}, {d.threads} threads: {d.draft_step_ms:.1f} / {d.target_step_ms:.1f} ms = "
        f"{d.draft_over_step:.2f}" for d in table.drafts))
    for r in table.ratios:
        print(f"ours / llama.cpp at {r.precision}, {r.threads} threads: decode {r.decode_over_llama_cpp:.3f}x "
              f"({r.decode_verdict}), prefill time {r.prefill_over_llama_cpp:.3f}x ({r.prefill_verdict})")
    if not any(s.who == "llama.cpp" for s in table.sides):
        print("llama.cpp: not installed (./scripts/setup_llama_cpp_peer.sh) or --no-peer: our rows alone")


def gemm_only(options: EngineBenchOptions, args) -> int:
    pair = load_pair(options.pair, device=options.device, threads=options.threads, kernels="compact",
                     precision=options.precision)
    return show(args, gemm_table(pair, options.repeats * 2), print_gemm_table)


def draft_reuse_only(options: EngineBenchOptions, args) -> int:
    engine = Engine(load_pair(options.pair, device=options.device, threads=options.threads, kernels=options.kernels,
                              precision=options.precision), PrefixKVStore(budget_bytes=1 << 30))
    long_ids, other = reuse_prompts(engine, load_humaneval(), options.long_prompt_tokens)
    engine.run(long_ids, Action.of_strategy(JOINT_K4), 2)  # warm-up of every path
    rows = draft_reuse_rows(engine, long_ids, other, options.repeats)
    return show(args, rows, lambda r: print_draft_reuse(r, len(long_ids)))


def print_generation(report: EngineReport) -> None:
    print(f"pair={report.pair} device={report.device} threads={report.threads} kernels={report.kernels} "
          f"(ours) vs stock (transformers) new_tokens={report.new_tokens} prompt={report.prompt_tokens} tokens "
          f"(HumanEval/2), repeats={report.repeats}")
    print(f"{'measure':<10} {'ours ms/tok':>12} {'hf ms/tok':>10} {'ratio':>7} {'goal':>6} "
          f"{'ours peak MiB':>14} {'hf peak MiB':>12} {'same output':>12} verdict")
    for label, row in ((AR, report.ar), (SPEC_K4, report.spec_k4)):
        goal = GENERATION_GOALS[label]
        print(f"{label:<10} {row.ours_ms_per_token:>12.2f} {row.hf_ms_per_token:>10.2f} {row.ratio:>7.3f} "
              f"{goal.bound_text().replace(' ', ''):>6} {row.ours_peak_mib:>14.1f} {row.hf_peak_mib:>12.1f} "
              f"{str(row.same_output):>12} {judge(goal, row.ratio)}")
    f, verify = report.floor, report.verify
    judged_k = [k for k in SPEC_K if k <= VERIFY_JUDGED_UP_TO_K]
    print(f"floor: {f.weight_bytes / 1e6:.0f} MB of target weights / {f.bandwidth_gb_s:.1f} GB/s streaming (sum "
          f"over 512 MiB) = {f.floor_ms:.1f} ms/token; our AR / floor = {f.ar_over_floor:.2f} "
          f"({judged(AR_OVER_FLOOR, f.ar_over_floor)})")
    print(f"verify(k+1) / one step at 256 tokens of context (step {verify.step_ms:.1f} ms): "
          + ", ".join(f"k={k} {verify.verify_over_step[k]:.2f}" for k in SPEC_K)
          + f" ({VERIFY_OVER_STEP.text()} for k <= {VERIFY_JUDGED_UP_TO_K}: "
          + ", ".join(f"k={k} {judge(VERIFY_OVER_STEP, verify.verify_over_step[k])}" for k in judged_k)
          + f"); monotone in k: {verify.monotone}")
    t = report.ttft
    print(f"TTFT on a {t.prompt_tokens}-token prompt: cold {t.cold_ms:.1f} ms, exact repeat {t.exact_ms:.2f} "
          f"ms (ratio {t.exact_over_cold:.3f}, {judged(TTFT_EXACT, t.exact_over_cold)}), 50 % partial hit "
          f"{t.partial_ms:.1f} ms (ratio {t.partial_over_cold:.3f}, {judged(TTFT_PARTIAL, t.partial_over_cold)})")
    if report.draft_reuse is not None:
        print_draft_reuse(report.draft_reuse, t.prompt_tokens)
    a = report.spec_k4_acceptance
    print(f"spec-k4 on this prompt: accepted/proposed {a.accepted_over_proposed:.3f}, per-token acceptance alpha "
          f"{a.alpha:.3f} (accepted / (accepted + rejecting rounds)) over {a.rounds} rounds")
    d = report.draft
    print(f"draft step at 256 tokens of context {d.draft_step_ms:.2f} ms vs target step "
          f"{d.target_step_ms:.2f} ms: ratio {d.draft_over_target:.3f} ({DRAFT_OVER_TARGET.text()}); its floor "
          f"{d.weight_bytes / 1e6:.0f} MB / {f.bandwidth_gb_s:.1f} GB/s = {d.floor_ms:.2f} ms, step / floor "
          f"{d.over_floor:.2f} ({judged(DRAFT_OVER_FLOOR, d.over_floor)}); draft / target: {d.verdict_over_target} "
          f"(its floor over the measured target step {d.floor_over_measured_target:.2f}; the floors' own ratio, "
          f"weight bytes alone, {d.floors_over_target:.2f}, context only)")


def print_kernels(report: EngineReport) -> None:
    batch = report.batch
    print("batched step, b requests each with its own 256-token context (ms; / one request): "
          + ", ".join(f"b={b} {t:.1f} ({t / batch.step_ms[1]:.2f})" for b, t in batch.step_ms.items())
          + " (goals " + ", ".join(f"b={b} {goal.bound_text()}" for b, goal in BATCH_GOALS.items()) + ")")
    allowed, floors = batch.floor_over_measured_one, batch.floors_over_one
    print("  verdicts: " + "; ".join(f"b={b} {verdict}" for b, verdict in batch.verdicts.items())
          + ("" if floors is None else " (the b-row floor over the measured one-row step: "
             + ", ".join(f"b={b} {allowed[b]:.2f}" for b in batch.verdicts) + "; the floors' own ratio, context only: "
             + ", ".join(f"b={b} {floors[b]:.2f}" for b in batch.verdicts) + ")"))
    if batch.by_kernel is not None:
        print("the same steps by kernel (ms; rakv.bench.roofline.row_costs), beside the floor (weights + the rows' K/V "
              "at the streaming bandwidth, or FLOPs at the FMA peak):")
        print("\n".join("  " + line for line in format_row_costs(batch.by_kernel)))
    c = report.chunk_beside_decodes
    print(f"a {c.chunk_tokens}-token prefill chunk beside 4 decoding requests: {c.with_chunk:.1f} ms vs the 4 decodes "
          f"alone {c.decodes:.1f} ms: {c.ratio:.2f}x ({judged(CHUNK_BESIDE_DECODES, c.ratio)})")
    pre = report.prefill
    seconds, before = pre.seconds, pre.previous_engine_seconds
    print("prefill (s), target / draft: " + ", ".join(
        f"{n} tokens {seconds.target[n]:.3f} / {seconds.draft[n]:.3f}" for n in seconds.target))
    if before is not None:
        print("  previous engine (data/reference/offline-fast-kernels, its own machine), target / draft: " + ", ".join(
            f"{n} {before.target[n]:.3f} / {before.draft[n]:.3f}" for n in before.target)
              + f"; faster at every point: {pre.faster_than_previous_everywhere} "
              f"({judged(PREFILL_FASTER, pre.share_faster())})")
    if report.gemm is not None:
        print_gemm_table(report.gemm)
    print_load(LoadReport(report.memory, report.startup))
    print_llama_cpp(report)


def print_llama_cpp(report: EngineReport) -> None:
    peer_row = report.llama_cpp
    if peer_row is None:
        print("llama.cpp: not installed (./scripts/setup_llama_cpp_peer.sh: builds from source, 10-30 min) or "
              "--no-peer")
        return
    for label, row in peer_row.models():
        if row.error:
            print(f"llama.cpp {label}: not measured: {row.error}")
            continue
        print(f"llama.cpp {row.version} {label}: decode {row.ms_per_token:.2f} ms/token, prefill "
              f"{row.prefill_tokens_per_s:.0f} tokens/s ({row.prefill_tokens} tokens); first 16 tokens "
              f"equal ours: {row.same_first_tokens_as_ours}")
    if peer_row.ar_over_f32 is not None:
        print(f"ours / llama.cpp F32: AR decode after the first token {peer_row.ours_decode_ms_per_token:.2f} "
              f"ms/token = {peer_row.ar_over_f32:.3f}x ({judged(LLAMA_CPP_DECODE, peer_row.ar_over_f32)}), prefill "
              f"of {report.prefill.prompt_tokens} tokens {report.prefill.ours_tokens_per_s:.0f} tokens/s = "
              f"{peer_row.prefill_over_f32:.2f}x ({judged(LLAMA_CPP_PREFILL, peer_row.prefill_over_f32)})")


def print_load(load: LoadReport) -> None:
    m: MemoryRow = load.memory
    start: StartupRow = load.startup
    print(f"memory (fresh process, our pair only): peak RSS {m.peak_rss_bytes / 1e6:.0f} MB vs weights "
          f"{m.weight_bytes / 1e6:.0f} MB + K/V {m.kv_bytes / 1e6:.1f} MB: ratio {m.over_weights_and_kv:.2f} "
          f"({MEMORY.text()}): {m.verdict}; information, not judged: above an interpreter with torch imported "
          f"({m.torch_baseline_bytes / 1e6:.0f} MB) {m.above_torch_over_weights_and_kv:.2f}; before loading "
          f"{m.rss_before_load_bytes / 1e6:.0f} MB (interpreter and libraries), peak once loaded "
          f"{m.peak_rss_after_load_bytes / 1e6:.0f} MB")
    print(f"start-up, fresh `rakv generate` to its first token: packed weights' cache cold "
          f"{start.cold_first_token_s:.1f} s (reads and packs the GGUF, writes the cache), warm "
          f"{start.warm_first_token_s:.1f} s (median of {start.warm_runs}; "
          f"{judged(STARTUP_WARM, start.warm_first_token_s)}); fresh `rakv serve --http` to the first token of a "
          f"completion asked when it is ready, cache warm {start.serve_warm_first_token_s:.1f} s "
          f"({judged(SERVE_STARTUP_WARM, start.serve_warm_first_token_s)})")


def write_precision_peer(args, record: PrecisionPeerFile) -> int:
    """--precision-peer: the record written (--out, or the shipped folder by the CPU's label), then shown."""
    from rakv.runtime.run_layout import PeerLayout

    out = args.out or PeerLayout.shipped().precision(record.machine.label)
    try:
        write_record(record, out)
    except OSError as exc:
        raise RakvError(f"cannot write {out}: {exc.strerror or exc}") from None
    show(args, record.table, print_precision_peer)
    if not args.json:
        print(f"bench_engine: wrote {out} (docs/engine.md: .venv/bin/python scripts/write_precision_table.py)")
    return 0


def main(argv=None) -> int:
    options, args = parse_args(argv)
    try:
        if args.probe == "rss":
            print(json.dumps(to_json(rss_probe(options))))
            return 0
        if args.gemm:
            return gemm_only(options, args)
        if args.draft_reuse:
            return draft_reuse_only(options, args)
        if args.load:
            return show(args, load_report(options), print_load)
        if args.precision_peer:
            if args.out is not None and args.out.exists() and args.out.is_dir():
                raise RakvError(f"--out {args.out} is a folder; give the record's file path")
            return write_precision_peer(args, precision_peer_file(options))
        pair, stock, engine, ids = load_sides(options)
    except RakvError as exc:
        print(f"bench_engine: error: {exc}", file=sys.stderr)
        return 2
    if args.probe:
        print(peak_increase_mib(make_sides(pair, stock, engine, ids, options.new_tokens)[args.probe], pair.device))
        return 0
    report = bench(options, pair, stock, engine, ids)
    if args.json:
        print(json.dumps(to_json(report)))
        return 0
    print_generation(report)
    print_kernels(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
