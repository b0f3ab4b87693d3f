"""The main study (paper/main.tex, "Setup"): plan, timed runs, and a crash-safe, resumable results journal.

A *configuration* is a pair with a proposer (`conf/pair/<name>.yaml`). For every configuration,
dataset, prompt, scenario and repeat the plan holds one run per strategy (ar, kv-only, spec-k4,
joint-k4, rakv-asd) and, for the oracle, one per feasible action (r, k). Runs execute in a
shuffled order (seed recorded); each starts from an empty store into which the scenario's
warm-ups are replayed untimed. Each finished run is appended to a JSONL journal and fsynced, so a
run killed at any moment loses at most the run in flight; rerunning skips what is done. The
Parquet table is written from the journal atomically (temp file + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rakv.cache import PrefixKVStore
from rakv.controller import Controller, ControllerConfig, predict_fixed, run_rakv_asd
from rakv.costmodel import calibration_for, calibration_key
from rakv.engine import Action, Engine, parse_strategy
from rakv.engine import open_engine as engine_for
from rakv.errors import RakvError
from rakv.workloads import Prompt, build_scenario, dataset_texts, select_prompts

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


# ---------------------------------------------------------------------------------------------
# Configuration helpers


def load_group(group: str, name: str) -> DictConfig:
    """One option of a Hydra config group by name (profiles list several pairs and datasets)."""
    path = CONF_DIR / group / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        raise RakvError(f"unknown {group} '{name}'; choose one of: {', '.join(options)}")
    return OmegaConf.load(path)


@dataclass
class Configuration:
    name: str
    pair: str
    proposer: str


def configurations(cfg: DictConfig) -> list[Configuration]:
    out = []
    for name in cfg.configurations:
        entry = load_group("pair", name)
        out.append(Configuration(name=name, pair=entry.name, proposer=entry.proposer))
    return out


def open_engine(cfg: DictConfig, configuration: Configuration) -> Engine:
    return engine_for(configuration.pair, configuration.proposer, device=cfg.device, dtype=cfg.dtype,
                      threads=cfg.threads, cache_budget_mib=cfg.cache.budget_mib, kernels=cfg.kernels)


def controller_config(cfg: DictConfig) -> ControllerConfig:
    c = cfg.controller
    return ControllerConfig(k_set=tuple(c.k_set), beta=c.beta, memory_penalty_s_per_byte=c.memory_penalty_s_per_byte,
                            memory_budget_mib=c.memory_budget_mib)


def cost_table_for(cfg: DictConfig, engine: Engine):
    """The calibration of this configuration on this machine; measured now if missing or stale."""
    table = calibration_for(engine, cfg.calibration.recalibrate)
    out = results_dir(cfg) / "calibration" / f"{engine.pair.name}-{engine.proposer}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(table.to_json(), indent=1))
    return table


def results_dir(cfg: DictConfig) -> Path:
    return Path(cfg.results_dir)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def prompts_for(cfg: DictConfig, encode, dataset: str) -> list[Prompt]:
    """The profile's seeded prompt selection from one configured dataset (`encode`: text -> token ids)."""
    if dataset not in cfg.data:
        raise RakvError(f"dataset '{dataset}' has no entry under data (configured: {', '.join(cfg.data)})")
    entry = cfg.data[dataset]
    grid = cfg.profile.study
    texts = dataset_texts(entry.name, entry.source, entry.split)
    return select_prompts(dataset, texts, encode, [tuple(b) for b in grid.length_bins], grid.prompts_per_bin,
                          seed=cfg.seed)


# ---------------------------------------------------------------------------------------------
# The journal: one JSON line per finished run, fsynced


class Journal:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rows = self._recover()
        self.done = {row["run_id"] for row in self.rows}

    def _recover(self) -> list[dict]:
        """Read complete lines; a torn last line (killed mid-write) is cut off so appends stay clean."""
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        good = data.rfind(b"\n") + 1
        if good < len(data):
            with open(self.path, "r+b") as fh:
                fh.truncate(good)
        rows, seen = [], set()
        for line in data[:good].splitlines():
            row = json.loads(line)
            if row["run_id"] not in seen:  # cannot happen with one writer; kept as a guard
                seen.add(row["run_id"])
                rows.append(row)
        return rows

    def append(self, row: dict) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.rows.append(row)
        self.done.add(row["run_id"])


def write_parquet(rows: list[dict], path: Path) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return frame


# ---------------------------------------------------------------------------------------------
# Provenance


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=CONF_DIR.parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=CONF_DIR.parent).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else None
    except OSError:
        return None


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    names = ("rakv", "torch", "transformers", "datasets", "hydra-core", "pandas", "pyarrow", "scipy", "numpy")
    out = {"python": sys.version.split()[0]}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def metadata(cfg: DictConfig, extra: dict) -> dict:
    return {"config": OmegaConf.to_container(cfg, resolve=True), "git_commit": git_commit(),
            "packages": package_versions(), **extra}


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class RunSpec:
    configuration: str
    dataset: str
    prompt_id: str
    scenario: str
    kind: str  # "strategy" or "sweep"
    strategy: str  # ar, kv-only, spec-k4, joint-k4, rakv-asd; for a sweep run the action label (r1k4)
    repeat: int

    @property
    def run_id(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.blake2b(blob, digest_size=10).hexdigest()


def sweep_actions(controller: Controller, prompt_tokens: int, hit, new_tokens: int) -> list[Action]:
    return controller.feasible_actions(controller.features(prompt_tokens, hit, new_tokens), hit)[0]


def donor_of(chosen: list[Prompt], index: int) -> tuple[int, ...]:
    """The prompt whose tokens extend or diverge from prompt `index` in its scenarios: the next one drawn."""
    return chosen[(index + 1) % len(chosen)].token_ids


def plan_runs(cfg, configuration: Configuration, prompts: dict[str, list[Prompt]], controller: Controller,
              engine: Engine) -> list[RunSpec]:
    """Every run of one configuration. The sweep's feasible actions come from the controller's own rule."""
    grid, specs = cfg.profile.study, []
    for dataset, chosen in prompts.items():
        for index, prompt in enumerate(chosen):
            donor = donor_of(chosen, index)
            for scenario_name in cfg.experiment.scenarios:
                scenario = build_scenario(scenario_name, prompt.token_ids, donor)
                hit = hit_after_warmups(engine, scenario, prompt)
                for repeat in range(grid.repeats):
                    for strategy in cfg.experiment.strategies:
                        specs.append(RunSpec(configuration.name, dataset, prompt.id, scenario_name, "strategy",
                                             strategy, repeat))
                for repeat in range(grid.sweep_repeats):
                    for action in sweep_actions(controller, len(prompt.token_ids), hit, grid.new_tokens):
                        specs.append(RunSpec(configuration.name, dataset, prompt.id, scenario_name, "sweep",
                                             action.label, repeat))
    return specs


def hit_after_warmups(engine: Engine, scenario, prompt: Prompt):
    """What the store would offer the prompt in this scenario: computed on token ids alone, without a model."""
    store = PrefixKVStore(budget_bytes=engine.store.budget_bytes)
    ns = engine.namespace(None)
    for warm in scenario.warmups:  # placeholder tensors: only the token ids matter for matching
        store.insert(ns, np.asarray(warm), [(torch.zeros(1, 1, len(warm), 1),) * 2], torch.zeros(1))
    return store.peek(ns, np.asarray(prompt.token_ids))


def predicted_seconds(controller: Controller, engine: Engine, spec: RunSpec, prompt: Prompt, scenario,
                      new_tokens: int) -> float:
    """Wall time of one planned run from the cost tables: the warm-up prefills, then the request itself
    (rakv-asd as the action it would choose now; the AR reference and kernel warm-ups are not counted)."""
    table = controller.table
    warmups = sum(table.target_prefill(len(w)) + table.target_step(len(w)) for w in scenario.warmups)
    hit = hit_after_warmups(engine, scenario, prompt)
    if spec.strategy == "rakv-asd":
        return warmups + controller.decide(len(prompt.token_ids), hit, new_tokens).predicted_latency_s
    action = label_action(spec.strategy) if spec.kind == "sweep" else parse_strategy(spec.strategy)
    return warmups + predict_fixed(controller, len(prompt.token_ids), hit, new_tokens, action)


def format_duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def describe_plan(specs: list[RunSpec]) -> str:
    lines = [f"plan: {len(specs)} timed runs "
             f"({sum(s.kind == 'strategy' for s in specs)} strategy runs + {sum(s.kind == 'sweep' for s in specs)} "
             "action-sweep runs)"]
    for factor in ("configuration", "dataset", "scenario", "kind", "strategy", "repeat"):
        counts = Counter(getattr(s, factor) for s in specs)
        lines.append(f"  {factor:<13} " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items(), key=str)))
    lines.append(f"  prompts       {len({(s.dataset, s.prompt_id) for s in specs})}")
    return "\n".join(lines)


def label_action(label: str) -> Action:
    return Action(label[1] == "1", int(label[3:]))


# ---------------------------------------------------------------------------------------------
# Running


def output_hash(tokens: list[int]) -> str:
    return hashlib.blake2b(json.dumps(tokens).encode(), digest_size=8).hexdigest()


def reset_store(engine: Engine, warmups) -> None:
    """A defined store state before a timed request: empty, then the scenario's warm-ups replayed (untimed)."""
    engine.store.clear()
    for warm in warmups:
        engine.run(list(warm), Action(False, 0), 1, ignore_eos=True)


def timed_run(engine: Engine, controller: Controller, spec: RunSpec, prompt: Prompt, scenario, new_tokens: int):
    """One timed request from a defined store state: empty store, warm-ups replayed untimed."""
    reset_store(engine, scenario.warmups)
    ids = list(prompt.token_ids)
    if spec.strategy == "rakv-asd":
        return run_rakv_asd(engine, controller, ids, new_tokens, ignore_eos=True)
    action = label_action(spec.strategy) if spec.kind == "sweep" else parse_strategy(spec.strategy)
    hit = engine.peek(ids)
    result = engine.run(ids, action, new_tokens, ignore_eos=True)
    result.extra["predicted_latency_s"] = predict_fixed(controller, len(ids), hit, new_tokens, action)
    result.extra["available_hit_tokens"] = hit.reused_tokens
    return result


def result_row(spec: RunSpec, configuration: Configuration, prompt: Prompt, scenario, result, reference: list[int],
               order: int, seed: int) -> dict:
    row = result.to_json()
    for name in ("token_ids", "text", "round_log", "id", "proposer", "strategy"):
        row.pop(name, None)
    if isinstance(row.get("predictions"), dict):
        row["predictions"] = json.dumps(row["predictions"])
    row.pop("infeasible_actions", None)
    return {"run_id": spec.run_id, **asdict(spec), "pair": configuration.pair, "proposer": configuration.proposer,
            "length_bin": prompt.length_bin, "reuse_rate_target": scenario.reuse_rate_target,
            "reuse_rate": result.hit_tokens / result.prompt_tokens if result.reuse else 0.0,
            "action": Action(result.reuse, result.k).label, **row,
            "output_hash": output_hash(result.token_ids), "equal_to_ar": result.token_ids == reference,
            "order": order, "seed": seed}


@dataclass
class PreparedConfiguration:
    """One configuration ready to run: its engine, controller, prompts, whole plan and this shard's share."""

    configuration: Configuration
    engine: Engine
    controller: Controller
    prompts: dict[str, list[Prompt]]
    specs: list[RunSpec]
    mine: list[RunSpec]  # this shard's runs, in the shuffled execution order

    def prompt_and_donor(self, spec: RunSpec) -> tuple[Prompt, tuple[int, ...]]:
        chosen = self.prompts[spec.dataset]
        index = next(i for i, p in enumerate(chosen) if p.id == spec.prompt_id)
        return chosen[index], donor_of(chosen, index)


def prepare(cfg: DictConfig, configuration: Configuration) -> PreparedConfiguration:
    engine = open_engine(cfg, configuration)
    controller = Controller(cost_table_for(cfg, engine), controller_config(cfg))
    prompts = {d: prompts_for(cfg, engine.encode, d) for d in cfg.datasets}
    specs = plan_runs(cfg, configuration, prompts, controller, engine)
    order = list(range(len(specs)))
    random.Random(cfg.seed).shuffle(order)  # recorded: the seed is in every row and in metadata
    mine = [specs[i] for i in order if i % cfg.study.num_shards == cfg.study.shard_index]
    return PreparedConfiguration(configuration, engine, controller, prompts, specs, mine)


def run_main_study(cfg: DictConfig) -> Path:
    """Plan every configuration, print the plan, then execute (or resume) the runs; returns the Parquet path."""
    out_dir = results_dir(cfg) / "study"
    out_dir.mkdir(parents=True, exist_ok=True)
    shard, shards = cfg.study.shard_index, cfg.study.num_shards
    if not 0 <= shard < shards:
        raise RakvError(f"study.shard_index must be in [0, {shards}), got {shard}")
    journal = Journal(out_dir / (f"runs.shard{shard}of{shards}.jsonl" if shards > 1 else "runs.jsonl"))
    prepared = [prepare(cfg, configuration) for configuration in configurations(cfg)]
    all_specs = [spec for p in prepared for spec in p.specs]
    calibrations = {p.configuration.name: calibration_key(p.engine.pair, p.engine.proposer) for p in prepared}
    plan = describe_plan(all_specs)
    planned = {s.run_id for s in all_specs}
    stray = [r for r in journal.rows if r["run_id"] not in planned]
    if stray:
        raise RakvError(f"{journal.path} holds {len(stray)} runs of a different plan; "
                        "use another results_dir or remove the old results")
    todo = {p.configuration.name: [s for s in p.mine if s.run_id not in journal.done] for p in prepared}
    if not cfg.study.merge_only:
        expected = sum(predicted_seconds(p.controller, p.engine, spec, *scenario_of(p, spec),
                                         cfg.profile.study.new_tokens)
                       for p in prepared for spec in todo[p.configuration.name])
        plan += (f"\n  this shard: {sum(map(len, todo.values()))} runs to do; expected wall time "
                 f"{format_duration(expected)} (predicted from the cost tables)")
    print(plan, flush=True)
    write_atomic(out_dir / "plan.txt", plan + "\n")
    for p in ([] if cfg.study.merge_only else prepared):
        name = p.configuration.name
        print(f"{name}: {len(p.mine)} runs planned here, {len(p.mine) - len(todo[name])} already done", flush=True)
        if todo[name]:
            _execute(cfg, p, todo[name], journal)
    return finalize(cfg, out_dir, all_specs, calibrations)


def scenario_of(p: PreparedConfiguration, spec: RunSpec):
    prompt, donor = p.prompt_and_donor(spec)
    return prompt, build_scenario(spec.scenario, prompt.token_ids, donor)


def _execute(cfg, p: PreparedConfiguration, todo: list[RunSpec], journal: Journal) -> None:
    grid, engine, controller = cfg.profile.study, p.engine, p.controller
    # AR reference of every prompt (untimed), the target of every equality check
    references = {(d, prompt.id): engine.run(list(prompt.token_ids), Action(False, 0), grid.new_tokens,
                                             ignore_eos=True).token_ids
                  for d, chosen in p.prompts.items() for prompt in chosen}
    first = next(iter(p.prompts.values()))[0]
    for _ in range(grid.model_warmup_requests):  # warm kernels and allocator before timing
        engine.run(list(first.token_ids), Action(True, max(cfg.controller.k_set)), grid.new_tokens, ignore_eos=True)
    last_alpha = [r["alpha_after"] for r in sorted(journal.rows, key=lambda r: r["order"])
                  if r["configuration"] == p.configuration.name and r.get("alpha_after") is not None]
    if last_alpha:  # resume the controller's acceptance estimate where the interrupted run left it
        controller.tracker.accepted, controller.tracker.rejected = last_alpha[-1], 1 - last_alpha[-1]
    position = {s.run_id: i for i, s in enumerate(p.mine)}
    for spec in tqdm(todo, desc=f"study {p.configuration.name}", unit="run", dynamic_ncols=True, mininterval=2):
        prompt, scenario = scenario_of(p, spec)
        result = timed_run(engine, controller, spec, prompt, scenario, grid.new_tokens)
        journal.append(result_row(spec, p.configuration, prompt, scenario, result,
                                  references[(spec.dataset, spec.prompt_id)], position[spec.run_id], cfg.seed))


def finalize(cfg, out_dir: Path, specs: list[RunSpec], calibrations: dict) -> Path:
    """Merge every shard's journal into runs.parquet once all planned runs are present."""
    rows, seen = [], set()
    for path in sorted(out_dir.glob("runs*.jsonl")):
        for row in Journal(path).rows:
            if row["run_id"] not in seen:
                seen.add(row["run_id"])
                rows.append(row)
    planned = {s.run_id for s in specs}
    missing = planned - seen
    if missing:
        print(f"study: {len(missing)} of {len(planned)} planned runs still missing (other shards?); "
              "rerun to complete or merge later", flush=True)
        return out_dir / "runs.parquet"
    rows = [r for r in rows if r["run_id"] in planned]
    path = out_dir / "runs.parquet"
    frame = write_parquet(rows, path)
    write_atomic(out_dir / "metadata.json", json.dumps(metadata(cfg, {
        "calibration_keys": calibrations, "hardware": next(iter(calibrations.values()))["hardware"],
        "runs": len(frame), "plan": describe_plan(specs)}), indent=1))
    strategy_rows = frame[frame.kind == "strategy"]
    unequal = int((~frame.equal_to_ar).sum())
    print(f"study: {len(frame)} runs in {path}; strategy runs equal to AR: "
          f"{int(strategy_rows.equal_to_ar.sum())}/{len(strategy_rows)}; all runs equal to AR: "
          f"{len(frame) - unequal}/{len(frame)}", flush=True)
    if unequal:
        raise RakvError(f"{unequal} runs produced output different from AR greedy decoding (equal_to_ar = false)")
    return path


def calibrate_configurations(cfg: DictConfig) -> None:
    """The calibrate stage: every configuration's cost table, copied into the results folder."""
    for configuration in configurations(cfg):
        engine = open_engine(cfg, configuration)
        table = cost_table_for(cfg, engine)
        print(f"calibration {configuration.name}: alpha = {table.acceptance:.3f}, target step "
              f"{table.target_step(256) * 1e3:.1f} ms at 256 tokens of context", flush=True)
