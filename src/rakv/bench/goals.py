"""Every goal the benchmarks judge, each declared once as data, and the one function that judges them.

A `Goal` is what is measured (`name`, and `measure`: where its value sits in the benchmark's report), a threshold
and a direction (at most / at least). `judge` gives its verdict, and the printed text is made from the record
(`Goal.text`), so no threshold is spelled again in a string. The goals are those of docs/engine.md (the engine
benchmark: scripts/bench_engine.py), docs/engine.md's serving paragraphs (scripts/bench_serving.py) and
docs/serving.md's "Over HTTP" (scripts/load_http.py, scripts/fuzz_http.py); the controller's decision time is
README.md's (scripts/bench_controller.py).

A ratio goal whose numerator has a floor or bound measured in the same run (a batched step's floor, the trace's
bound) is judged with it: met, missed, or out of reach at this baseline (rakv.bench.roofline.goal_verdict says
when that third verdict is a claim no faster engine can contradict).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rakv.bench.roofline import goal_verdict
from rakv.runtime.actions import AR, SPEC_K4

AT_MOST, AT_LEAST = "at most", "at least"
NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Goal:
    """One goal: `measure` (in `unit`) is `direction` `threshold`."""

    name: str  # what is judged, in words
    measure: str  # where the measured value sits in the report (its field path)
    threshold: float
    direction: str  # AT_MOST or AT_LEAST
    unit: str = ""  # "" (a ratio or a count), "%" (a share, printed as a percentage), "s", "us"

    def __post_init__(self):
        if self.direction not in (AT_MOST, AT_LEAST):
            raise ValueError(f"goal '{self.name}': direction must be '{AT_MOST}' or '{AT_LEAST}'")

    @property
    def higher_is_better(self) -> bool:
        return self.direction == AT_LEAST

    def bound_text(self) -> str:
        """The threshold with its sign, as printed: '<= 0.05', '>= 60 %', '<= 10 s'."""
        sign = ">=" if self.higher_is_better else "<="
        if self.unit == "%":
            return f"{sign} {100 * self.threshold:g} %"
        return f"{sign} {self.threshold:g}" + (f" {self.unit}" if self.unit else "")

    def text(self) -> str:
        """'goal <= 0.05', as the benchmarks print it beside a measured value."""
        return f"goal {self.bound_text()}"

    def line(self) -> str:
        """The goal in words with its threshold: 'TTFT of an exact repeat / cold <= 0.05'."""
        return f"{self.name} {self.bound_text()}"


def judge(goal: Goal, value: float | None, baseline: float = 1.0, limit: float | None = None) -> str:
    """`goal`'s verdict on `value` (over `baseline` for a ratio measured from its two terms): met, missed, out of
    reach at this baseline (only with `limit`, what the machine allows the numerator: rakv.bench.roofline
    .goal_verdict), or not measured (no value)."""
    if value is None:
        return NOT_MEASURED
    return goal_verdict(value, baseline, goal.threshold, limit, goal.higher_is_better)


def met(goal: Goal, value: float | None) -> bool:
    return judge(goal, value) == "met"


def goals_text(goals: list[Goal]) -> str:
    """The goals in words with their thresholds, one line each: a script's --help lists its goals from here."""
    return "goals (rakv.bench.goals):\n" + "\n".join(f"- {goal.line()}" for goal in goals)


# ---------------------------------------------------------------------------------------------
# the engine benchmark (scripts/bench_engine.py; docs/engine.md)

AR_VS_TRANSFORMERS = Goal("our AR / transformers' generate, ms per token", "ar.ratio", 0.55, AT_MOST)
SPEC_VS_TRANSFORMERS = Goal("our spec-k4 / transformers' assisted generation, ms per token", "spec_k4.ratio", 0.70,
                            AT_MOST)
GENERATION_GOALS = {AR: AR_VS_TRANSFORMERS, SPEC_K4: SPEC_VS_TRANSFORMERS}  # by the strategy timed
AR_OVER_FLOOR = Goal("our AR / the floor (target weights at the streaming bandwidth)", "floor.ar_over_floor", 1.6,
                     AT_MOST)
VERIFY_OVER_STEP = Goal("verify(k + 1) / one step (each k up to 4)", "verify.verify_over_step", 1.10, AT_MOST)
VERIFY_JUDGED_UP_TO_K = 4
DRAFT_OVER_TARGET = Goal("the draft's step / the target's", "draft.draft_over_target", 0.30, AT_MOST)
DRAFT_OVER_FLOOR = Goal("the draft's step / its floor", "draft.over_floor", 1.5, AT_MOST)
BATCH_GOALS = {8: Goal("a batched step of 8 requests / one", "batch.over_one.8", 1.3, AT_MOST),
               16: Goal("a batched step of 16 requests / one", "batch.over_one.16", 1.6, AT_MOST)}
CHUNK_BESIDE_DECODES = Goal("4 decodes with a 32-token prefill chunk / the 4 alone", "chunk_beside_decodes.ratio",
                            2.0, AT_MOST)
PREFILL_FASTER = Goal("prefill points faster than the previous engine's calibration",
                      "prefill.faster_than_previous_everywhere", 1.0, AT_LEAST, "%")
TTFT_EXACT = Goal("TTFT of an exact repeat / cold", "ttft.exact_over_cold", 0.05, AT_MOST)
TTFT_PARTIAL = Goal("TTFT after a 50 % partial hit / cold", "ttft.partial_over_cold", 0.6, AT_MOST)
DRAFT_REUSE_EXACT = Goal("the draft's prefill with its state in the store / without, exact repeat",
                         "draft_reuse.exact_repeat.ratio", 0.05, AT_MOST)
MEMORY = Goal("a fresh process's peak resident set / (weights held + K/V)", "memory.over_weights_and_kv", 1.3,
              AT_MOST)
STARTUP_WARM = Goal("a fresh `rakv generate` to its first token, packed weights' cache warm",
                    "startup.warm_first_token_s", 10.0, AT_MOST, "s")
SERVE_STARTUP_WARM = replace(STARTUP_WARM, name="a fresh `rakv serve --http` to a completion's first token, warm",
                             measure="startup.serve_warm_first_token_s")
LLAMA_CPP_DECODE = Goal("our AR decode after the first token / llama.cpp F32's", "llama_cpp.ar_over_f32", 1.0,
                        AT_MOST)
LLAMA_CPP_PREFILL = Goal("our prefill tokens/s / llama.cpp F32's", "llama_cpp.prefill_over_f32", 1.5, AT_LEAST)
# scripts/bench_engine.py --precision-peer (issue 62): ours at q4_1 against llama.cpp on the same Q4_1 file
PEER_Q4_DECODE = Goal("our q4_1 decode after the first token / llama.cpp Q4_1's", "ratios.decode_over_llama_cpp",
                      1.0, AT_MOST)
PEER_Q4_PREFILL = Goal("our q4_1 prefill time / llama.cpp Q4_1's", "ratios.prefill_over_llama_cpp", 1.0, AT_MOST)
PRECISION_PEER_GOALS = [PEER_Q4_DECODE, PEER_Q4_PREFILL]

ENGINE_GOALS = [AR_VS_TRANSFORMERS, SPEC_VS_TRANSFORMERS, LLAMA_CPP_DECODE, LLAMA_CPP_PREFILL, AR_OVER_FLOOR,
                DRAFT_OVER_TARGET, DRAFT_OVER_FLOOR, VERIFY_OVER_STEP, *BATCH_GOALS.values(), CHUNK_BESIDE_DECODES,
                PREFILL_FASTER, TTFT_EXACT, TTFT_PARTIAL, DRAFT_REUSE_EXACT, MEMORY, STARTUP_WARM,
                SERVE_STARTUP_WARM]

# ---------------------------------------------------------------------------------------------
# the serving benchmark (scripts/bench_serving.py; docs/engine.md)

OVER_SEQUENTIAL = {8: Goal("ours / sequential at c = 8", "rows[c=8].ours_over_sequential", 5.0, AT_LEAST),
                   16: Goal("ours / sequential at c = 16", "rows[c=16].ours_over_sequential", 8.0, AT_LEAST)}
OVER_TRANSFORMERS = {c: Goal(f"ours / transformers at c = {c}", f"rows[c={c}].ours_over_transformers", 1.5, AT_LEAST)
                     for c in (8, 16)}
SCHEDULER_SHARE = Goal("the scheduler's share of an iteration", "rows[].scheduler_share", 0.05, AT_MOST, "%")
OF_BOUND = {8: Goal("ours / the machine's bound at c = 8", "rows[c=8].of_bound", 0.60, AT_LEAST, "%"),
            16: Goal("ours / the machine's bound at c = 16", "rows[c=16].of_bound", 0.60, AT_LEAST, "%")}
SCALING = Goal("tok/s at c = 16 / at c = 8", "rows[c=16].ours_tok_s / rows[c=8].ours_tok_s", 1.2, AT_LEAST)
OVER_VLLM = {1: Goal("ours / vLLM at c = 1", "rows[c=1].ours_over_vllm", 2.0, AT_LEAST),
             8: Goal("ours / vLLM at c = 8", "rows[c=8].ours_over_vllm", 1.5, AT_LEAST),
             16: Goal("ours / vLLM at c = 16", "rows[c=16].ours_over_vllm", 1.5, AT_LEAST)}

SERVING_GOALS = [*OVER_SEQUENTIAL.values(), *OVER_TRANSFORMERS.values(), SCHEDULER_SHARE, *OF_BOUND.values(),
                 SCALING, *OVER_VLLM.values()]

# ---------------------------------------------------------------------------------------------
# rakv serve --http under load and fuzzed (scripts/load_http.py, scripts/fuzz_http.py; docs/serving.md)

LOAD_PROBLEMS = Goal("admitted requests not recorded once, ok or aborted (none admitted counts one)",
                     "accounting.problems", 0, AT_MOST)
IDLE_KV_BYTES = Goal("K/V bytes once idle", "idle.kv_bytes", 0, AT_MOST)
RSS_SPREAD = Goal("RSS spread after warm-up", "resources.rss_spread", 0.10, AT_MOST, "%")
THREAD_GROWTH = Goal("threads at rest after the load over before it", "resources.after.threads - before", 4,
                     AT_MOST)
SOCKET_GROWTH = Goal("sockets and fds at rest after the load over before it (the larger)",
                     "resources.after.sockets / fds - before", 2, AT_MOST)
UNCLEAN_EXIT = Goal("servers not drained to exit status 0 on SIGTERM", "server_rc", 0, AT_MOST)
HTTP_OVER_REPLAY = Goal("output tokens/s over HTTP / by trace replay (median of the repeats)", "throughput.median",
                        0.95, AT_LEAST)
LOAD_GOALS = [LOAD_PROBLEMS, IDLE_KV_BYTES, RSS_SPREAD, THREAD_GROWTH, SOCKET_GROWTH, UNCLEAN_EXIT, HTTP_OVER_REPLAY]


def fuzz_goals(examples: int) -> dict[str, Goal]:
    """scripts/fuzz_http.py's goals, by what each counts (`examples`: the generated requests asked for)."""
    return {"generated": Goal("generated requests", "cases", examples, AT_LEAST),
            "deaths": Goal("engine deaths (/health not 200)", "tally.engine_deaths", 0, AT_MOST),
            "hung": Goal("hung requests", "tally.hung", 0, AT_MOST),
            "server_errors": Goal("5xx answers other than 503-on-overload", "tally.server_errors", 0, AT_MOST),
            "faults": Goal("answers dropped or not conforming to the schema",
                           "tally.dropped + tally.nonconforming", 0, AT_MOST),
            "bad_inputs": Goal("bad inputs not answered 4xx or not followed by a good request served", "bad", 0,
                               AT_MOST),
            "ending": Goal("failures at the end: /health, a greedy request, drain to exit 0, records whole",
                           "final", 0, AT_MOST)}


DECISION_US = Goal("the controller's decision, store peek included, median", "total", 1000, AT_MOST, "us")
