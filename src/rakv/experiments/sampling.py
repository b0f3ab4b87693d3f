"""Sampling and workloads (paper/main.tex, "Sampling and workloads"; the design: conf/experiment/sampling.yaml,
the sizes: the profile's `sampling` section).

The main study decodes greedily on code and prose. This stage measures what changes when the request samples and
when the workload is not short code or prose. Each part writes one Parquet table under results/<profile>/sampling/
and is skipped when its table exists (delete it to measure again):

- runs:          per (configuration, temperature, prompt, seed) every fixed strategy (AR, spec-k for each k and
                 each verification rule) and rakv-asd, from an empty store; each row carries the accepted
                 candidates, their closed form (rakv.runtime.verification.closed_form_moments) and both rules'
                 expected accepted count given each round's draft, so the analysis checks measured acceptance
                 against sum_x min(p, q) (token-wise) or its expectation given the drafts (block), compares block
                 with token-wise verification and gives the controller's speedup per temperature. One controller
                 learns acceptance per temperature (rakv.runtime.controller.Controller.start), each starting from
                 the acceptance measured at that temperature on the calibration's prompts (acceptance.json), the
                 cost table being the calibration's (a step costs what it costs at any temperature).
- distribution:  per (configuration, prompt, arm, seed) the first tokens sampled at the distribution temperature and
                 the target's log-likelihood of them: plain sampling (k = 0) against speculative sampling under each
                 rule, including the deliberately biased rule (the positive control); the analysis runs the
                 two-sample tests (rakv.experiments.sampling_stats).
- structured:    per (configuration, schema record, strategy) a JSON object generated greedily, its validity
                 (parses; matches the schema) and latency (rakv.runtime.structured_outputs).
- long_context:  WikiText-2 articles of thousands of tokens as retrieved documents, several questions each asked
                 as separate requests sharing the document, documents taken in turn, under each store budget (the
                 smaller one forces evictions): hit tokens, TTFT, latency, evictions per strategy (AR, which never
                 reads the store, measured under the first budget and standing for all).

Every request's sampling seed is derived from the run's seed and the request's identity (`request_seed`), so the
stage is reproducible and the arms of the distribution tests draw independent streams.

As jobs (docs/cluster.md: `study.num_shards`, `study.shard_index`, `study.merge_only`): a unit is one part of one
configuration (`runs`, `structured`, `long_context`: each has its own controller and store sequence in one process
too) or one distribution-test prompt of one configuration (each starts from a cleared store, its seeds fixed by its
identity). A shard runs its units on the calibration job's tables (read only) and writes each under
sampling/units/; the merge writes the parts' tables, acceptance.json and design.json from those files alone.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rakv.experiments.config import (
    configurations,
    controller_config,
    cost_table_for,
    engine_for,
    prompts_for,
    run_layout,
)
from rakv.experiments.metadata import Hardware, SamplingDesign, read_sampling_design, write_sampling_design
from rakv.experiments.records import (
    ShardUnit,
    git_commit,
    read_units,
    units_dealt,
    write_atomic,
    write_parquet,
    write_unit,
)
from rakv.experiments.schema import SamplingSection, ShardOptions, section
from rakv.experiments.sensitivity import mixed_prompts
from rakv.runtime.actions import ADAPTIVE, AR, Action, spec
from rakv.runtime.calibration import hardware_fingerprint
from rakv.runtime.controller import Controller
from rakv.runtime.costmodel import acceptance_estimate
from rakv.runtime.decoding import Sampling, forward
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import load_record
from rakv.runtime.kernels import new_kv_cache
from rakv.runtime.run_layout import RunLayout
from rakv.runtime.strategies import run_strategy
from rakv.runtime.structured_outputs import schema_of, validity
from rakv.runtime.verification import probabilities
from rakv.runtime.workloads import calibration_prompts, dataset_texts, select_documents, wikitext2_articles

PARTS = ("runs", "distribution", "structured", "long_context")
PLAIN = "plain"  # the distribution tests' reference arm: sampling without speculation


def request_seed(run_seed: int, *identity) -> int:
    """A sampling seed for one request, from the run's seed and what identifies the request (stable across Python
    processes, unlike hash())."""
    text = json.dumps([run_seed, *map(str, identity)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=6).digest(), "little")


def table_of(cfg: DictConfig, engine):
    """The configuration's cost table: the calibration job's, read only, in a shard (study.num_shards > 1); else
    this machine's calibration (measured now if missing or stale)."""
    if section(cfg.study).num_shards > 1:
        from rakv.experiments.calibrations import shared_table

        return shared_table(cfg.results_dir, engine)
    return cost_table_for(cfg, engine)


def sampling_for(cfg: DictConfig, temperature: float, seed: int, verify: str = "token") -> Sampling:
    return Sampling(temperature=float(temperature), top_p=float(cfg.experiment.top_p) if temperature else 1.0,
                    seed=seed, verify=verify)


def strategies_at(cfg: DictConfig, temperature: float) -> list[tuple[str, str]]:
    """(strategy, verification rule) pairs measured at one temperature: AR, spec-k under each rule (one rule when
    greedy), rakv-asd under token-wise verification."""
    rules = list(cfg.experiment.verify_rules) if temperature > 0 else ["token"]
    return ([(AR, "token")] + [(spec(k), rule) for k in cfg.experiment.ks for rule in rules]
            + [(ADAPTIVE, "token")])


def acceptance_at(cfg: DictConfig, engine, temperature: float) -> float:
    """The acceptance of spec-k4 at `temperature` over the calibration's prompts (never a study prompt): where the
    controller of that temperature starts."""
    if temperature <= 0:
        return table_of(cfg, engine).acceptance
    round_log = []
    for index, ids in enumerate(calibration_prompts(engine.encode)[:3]):
        sampling = sampling_for(cfg, temperature, request_seed(cfg.seed, "calibration", temperature, index))
        round_log += engine.run(ids, Action(False, 4), 48, sampling=sampling, ignore_eos=True).round_log
    alpha = acceptance_estimate(round_log)
    return alpha if alpha is not None else 0.0


def run_rows(cfg: DictConfig, name: str, engine, prompts, tick) -> tuple[list[dict], dict]:
    sizes: SamplingSection = section(cfg.profile.sampling)
    table = table_of(cfg, engine)
    rows, alphas = [], {}
    controller = Controller(table, controller_config(cfg))  # one, learning per temperature (Controller.start)
    for temperature in cfg.experiment.temperatures:
        alpha = alphas[float(temperature)] = acceptance_at(cfg, engine, temperature)
        controller.start(temperature, alpha)
        for seed_index in range(sizes.seeds):
            for prompt in prompts:
                seed = request_seed(cfg.seed, name, temperature, prompt.id, seed_index)
                for strategy, rule in strategies_at(cfg, temperature):
                    engine.store.clear()
                    result = run_strategy(engine, strategy, list(prompt.token_ids), sizes.new_tokens,
                                          controller=controller, ignore_eos=True,
                                          sampling=sampling_for(cfg, temperature, seed, rule))
                    tick()
                    rows.append({"configuration": name, "dataset": prompt.dataset, "prompt_id": prompt.id,
                                 "seed_index": seed_index, "seed": seed, "controller_alpha0": alpha,
                                 **result.to_row(), "verify": rule if temperature > 0 else "greedy",
                                 "strategy": strategy})
    return rows, alphas


def sample_statistics(engine, prompt: list[int], tokens: list[int], sampling: Sampling) -> tuple[float, int]:
    """The target's view of one sample: log p(tokens | prompt) under its sampling distribution (temperature, top-p),
    and at how many positions the sample took the target's most likely token (a speculative sampler biased towards
    the mode, the likeliest way for one to go wrong, shifts this count first). From the prompt's stored K/V and
    logits (the store holds the prompt: every arm ran it)."""
    ns = engine.namespace(None)
    hit, kv, logits, _ = engine.store.lookup(ns, np.asarray(prompt, dtype=np.int64))
    if not hit.exact:
        raise RakvError("the distribution part expects the prompt in the store")
    target = engine.pair.target.module
    cache = new_kv_cache(target, kv)
    rows = [logits.reshape(1, -1)]
    if len(tokens) > 1:
        ids = torch.tensor([tokens[:-1]], dtype=torch.long, device=engine.pair.device)
        rows.append(forward(target, ids, cache, keep=len(tokens) - 1))
    p = probabilities(torch.cat(rows).float(), sampling)
    chosen = torch.tensor(tokens, device=p.device)
    picked = p[torch.arange(len(tokens)), chosen]
    return float(picked.clamp_min(1e-30).log().sum()), int((p.argmax(-1) == chosen).sum())


def distribution_rows(cfg: DictConfig, name: str, engine, prompts, tick) -> list[dict]:
    """Each arm's samples of the first `positions` tokens; the prompt's K/V reused (exact hit) so every sample
    decodes only. Arms alternate within each seed, so a slow drift of the machine touches all alike. The speculative
    arms of one seed index share their seed (plain sampling has its own): their first round verifies the same draft
    candidates, so block and token-wise verification are compared on that round paired (`first_accepted`)."""
    sizes, design = section(cfg.profile.sampling.distribution), cfg.experiment.distribution
    temperature = float(design.temperature)
    arms = [(PLAIN, 0, "token")] + [(rule, int(design.k), rule) for rule in design.arms]
    rows = []
    for prompt in prompts[: sizes.prompts]:
        ids = list(prompt.token_ids)
        engine.store.clear()
        engine.run(ids, Action(False, 1 if engine.proposer_type.has_draft_model else 0), 1, ignore_eos=True)
        for seed_index in range(sizes.seeds):
            for arm, k, rule in arms:
                seed = request_seed(cfg.seed, name, "distribution", prompt.id,
                                    PLAIN if arm == PLAIN else "speculative", seed_index)
                sampling = sampling_for(cfg, temperature, seed, rule)
                result = engine.run(ids, Action(True, k), sizes.positions, sampling=sampling, ignore_eos=True)
                tick()
                loglik, modes = sample_statistics(engine, ids, result.token_ids, sampling)
                rows.append({"configuration": name, "dataset": prompt.dataset, "prompt_id": prompt.id,
                             "arm": arm, "k": k, "temperature": temperature, "seed_index": seed_index,
                             "seed": seed, "tokens": json.dumps(result.token_ids),
                             "loglik": loglik, "argmax_tokens": modes,
                             "accepted": result.accepted, "rounds": result.rounds,
                             # the first round, never cut short (positions > k): its candidates and accepted ones
                             "first_proposed": result.round_log[0][0] if result.round_log else 0,
                             "first_accepted": result.round_log[0][1] if result.round_log else 0,
                             "rejections": result.rejections, "closed_form_accepted": result.closed_form_accepted,
                             "closed_form_variance": result.closed_form_variance,
                             # both rules' expected accepted candidates given each round's draft, summed
                             "expected_token": result.expected_accepted_token,
                             "expected_block": result.expected_accepted_block,
                             "latency_s": result.latency_s})
    return rows


def structured_rows(cfg: DictConfig, name: str, engine, controller, tick) -> list[dict]:
    """Greedy JSON generation per strategy on seeded records of each schema, validity judged by the schema."""
    sizes = section(cfg.profile.sampling.structured)
    texts = dataset_texts("structured")
    by_schema: dict[str, list] = {}
    for text_id, text in texts:
        by_schema.setdefault(text_id.split("/")[1], []).append((text_id, text))
    chosen = [item for group in by_schema.values() for item in group[: sizes.records]]
    rows = []
    for text_id, text in chosen:
        ids = engine.encode(text)
        for strategy in cfg.experiment.structured_strategies:
            engine.store.clear()
            result = run_strategy(engine, strategy, ids, sizes.new_tokens, controller=controller)
            tick()
            valid = validity(result.text, schema_of(text_id))
            rows.append({"configuration": name, "prompt_id": text_id, "schema": text_id.split("/")[1],
                         "strategy": strategy, "k": result.k, "prompt_tokens": result.prompt_tokens,
                         "new_tokens": result.new_tokens, "latency_s": result.latency_s,
                         "tokens_per_s": result.tokens_per_s, "accepted": result.accepted,
                         "rejections": result.rejections, "rounds": result.rounds,
                         "parses": valid.parses, "valid": valid.matches, "text": result.text})
    return rows


def rotated(strategies: list[str], turn: int) -> list[str]:
    """The strategies starting at the `turn`-th (modulo): which one runs first after the store is restored changes
    from request to request, so none always pays for being first (in the reference run of e0bb3e7 AR, always first,
    prefilled a 2.9k-token miss in 6.6 s where kv-only, right after it, took 6.0 s)."""
    turn %= max(len(strategies), 1)
    return strategies[turn:] + strategies[:turn]


def long_context_rows(cfg: DictConfig, name: str, engine, controller, tick) -> list[dict]:
    """Each budget: an empty store, then per length bin the documents' questions in turn (document 1's first
    question, document 2's first, ..., then the second questions: a bin's documents compete for the store), every
    strategy on the same store state (restored per strategy), in an order rotated per request (`rotated`). AR never
    reads the store, so it runs under the first budget only and its rows stand for the other budgets too
    (`measured_under_mib` says where a row was measured)."""
    sizes, design = section(cfg.profile.sampling.long_context), cfg.experiment.long_context
    entry = cfg.data.wikitext2
    documents = select_documents(wikitext2_articles(entry.source, entry.split), engine.encode,
                                 [tuple(b) for b in sizes.bins], sizes.per_bin, sizes.questions, cfg.seed)
    by_bin: dict[str, list] = {}
    for document in documents:
        by_bin.setdefault(document.length_bin, []).append(document)
    configured = engine.store.budget_bytes
    rows, ar_rows, turn = [], {}, 0
    # one untimed request on the longest document first: measured alone (a resumed stage, or the part deleted to
    # measure again) the part's first request would time the process's first pass over thousands of positions
    # (29.0 s against ~2.9 s warm for a 1,370-token document when the part was re-measured alone at 8d18605)
    longest = max(documents, key=lambda d: len(d.document))
    engine.run(list(longest.document) + list(longest.questions[0]), Action(False, 0), 1, ignore_eos=True)
    try:
        for budget in sizes.budgets_mib:
            engine.store.budget_bytes = int(budget * (1 << 20))
            engine.store.clear()
            for question, document in ((q, d) for group in by_bin.values() for q in range(sizes.questions)
                                       for d in group):
                ids = list(document.document) + list(document.questions[question])
                snapshot = engine.store.snapshot()
                for strategy in rotated(list(design.strategies), turn):
                    if strategy == AR and (document.id, question) in ar_rows:
                        rows.append({**ar_rows[document.id, question], "budget_mib": budget})
                        continue
                    engine.store.restore(snapshot)
                    before = engine.store.stats.evictions
                    result = run_strategy(engine, strategy, ids, sizes.new_tokens, controller=controller,
                                          ignore_eos=True)
                    tick()
                    rows.append({"configuration": name, "budget_mib": budget, "measured_under_mib": budget,
                                 "document": document.id, "length_bin": document.length_bin,
                                 "question": question, "strategy": strategy, "prompt_tokens": result.prompt_tokens,
                                 "document_tokens": len(document.document),
                                 "available_hit_tokens": result.available_hit_tokens,
                                 "hit_tokens": result.hit_tokens, "k": result.k, "reuse": result.reuse,
                                 "ttft_s": result.ttft_s, "latency_s": result.latency_s,
                                 "accepted": result.accepted, "rejections": result.rejections,
                                 "rounds": result.rounds,
                                 "evictions": engine.store.stats.evictions - before})
                    assert rows[-1]["evictions"] >= 0, "long_context: the store's eviction counter went back"
                    if strategy == AR:
                        ar_rows[document.id, question] = rows[-1]
                turn += 1
                # the store continues from the state the last strategy left (every strategy stores the prompt)
    finally:
        engine.store.budget_bytes = configured
        engine.store.clear()
    return rows


def distribution_configurations(cfg: DictConfig) -> list[str]:
    """The configurations the distribution tests run on (the profile's choice; all of them by default)."""
    chosen = section(cfg.profile.sampling.distribution).configurations
    return chosen if chosen is not None else list(cfg.configurations)


def planned_requests(cfg: DictConfig) -> dict[str, int]:
    sizes, design = section(cfg.profile.sampling), cfg.experiment
    prompts = sizes.prompts_per_dataset * len(cfg.datasets)
    runs = sum(len(strategies_at(cfg, t)) for t in design.temperatures) * prompts * sizes.seeds
    return {"runs": runs,
            "distribution": sizes.distribution.prompts * sizes.distribution.seeds * (1 + len(design.distribution.arms)),
            "structured": 2 * sizes.structured.records * len(design.structured_strategies),
            # AR under the first budget only (long_context_rows)
            "long_context": (len(sizes.long_context.bins) * sizes.long_context.per_bin * sizes.long_context.questions
                             * (len(sizes.long_context.budgets_mib) * len(design.long_context.strategies)
                                - (AR in design.long_context.strategies)
                                * (len(sizes.long_context.budgets_mib) - 1)))}


def run_sampling(cfg: DictConfig) -> None:
    if cfg.profile.sampling is None:  # the schema's default: a profile without the section
        print(f"sampling: profile {cfg.profile.name} has no sampling section; skipped", flush=True)
        return
    layout = run_layout(cfg)
    layout.sampling_dir.mkdir(parents=True, exist_ok=True)
    todo = [part for part in PARTS if not layout.sampling_table(part).exists()]
    if not todo:
        print(f"sampling: every part is in {layout.sampling_dir}; delete a part's table to measure it again",
              flush=True)
        return
    shards: ShardOptions = section(cfg.study)
    if shards.merge_only:
        merge_sampling(cfg, todo)
        return
    if shards.num_shards > 1:
        run_sampling_shard(cfg, todo, shards)
        return
    # the design the analysis reads (the tests' level, the resamples of the power estimate), and where and from
    # which commit the stage measured (it may run after the study, from a later commit)
    # (parts measured earlier keep the commit they were measured with)
    design = read_sampling_design(layout)
    commits = {**(design.parts if design else {}), **{part: git_commit() for part in todo}}
    hardware = load_record(Hardware, hardware_fingerprint(torch.device(cfg.device), cfg.dtype), "hardware")
    write_sampling_design(SamplingDesign(experiment=OmegaConf.to_container(cfg.experiment),
                                         sizes=OmegaConf.to_container(cfg.profile.sampling), parts=commits,
                                         hardware=hardware), layout)
    planned = planned_requests(cfg)
    print("sampling: plan " + ", ".join(f"{part} {planned[part]}" for part in todo)
          + " timed requests per configuration", flush=True)
    opened = {}
    for configuration in configurations(cfg):  # every engine and its controller once, for all parts
        engine = engine_for(cfg, configuration)
        prompts = mixed_prompts([p for d in cfg.datasets for p in prompts_for(cfg, engine.encode, d)],
                                section(cfg.profile.sampling).prompts_per_dataset * len(cfg.datasets))
        opened[configuration.name] = engine, prompts
    for part in todo:  # each part's table written when it is complete, so an interrupted stage resumes by part
        rows, alphas = [], {}
        for name, (engine, prompts) in opened.items():
            if part == "distribution" and name not in distribution_configurations(cfg):
                continue
            controller = Controller(cost_table_for(cfg, engine), controller_config(cfg))
            with tqdm(total=planned[part], desc=f"sampling {part} {name}", unit="request", dynamic_ncols=True,
                      mininterval=2) as bar:
                if part == "runs":
                    measured, alphas[name] = run_rows(cfg, name, engine, prompts, bar.update)
                elif part == "distribution":
                    measured = distribution_rows(cfg, name, engine, prompts, bar.update)
                elif part == "structured":
                    measured = structured_rows(cfg, name, engine, controller, bar.update)
                else:
                    measured = long_context_rows(cfg, name, engine, controller, bar.update)
            rows += measured
        if alphas:  # where each temperature's controller started
            write_atomic(layout.sampling_acceptance, json.dumps(alphas, indent=1))
        write_parquet(rows, layout.sampling_table(part))
        print(f"sampling: wrote {layout.sampling_table(part)} ({len(rows)} rows)", flush=True)


def read_part(results, part: str) -> pd.DataFrame | None:
    path = RunLayout.of(results).sampling_table(part)
    return pd.read_parquet(path) if path.exists() else None


def sampling_units(cfg: DictConfig, parts: list[str]) -> list[str]:
    """The units of `parts` in one process's row order: `<configuration>.<part>`, and per distribution-test prompt
    `<configuration>.distribution.<i>` (i below the profile's distribution prompts)."""
    count = section(cfg.profile.sampling.distribution).prompts
    units = []
    for part in parts:
        for name in cfg.configurations:
            if part != "distribution":
                units.append(f"{name}.{part}")
            elif name in distribution_configurations(cfg):
                units += [f"{name}.distribution.{i}" for i in range(count)]
    return units


def run_sampling_shard(cfg: DictConfig, todo: list[str], shards: ShardOptions) -> None:
    """This shard's units, on the calibration job's tables; each unit's rows and record under sampling/units/."""
    from rakv.experiments.calibrations import host, table_digest
    from rakv.experiments.config import configuration

    folder = run_layout(cfg).stage_units("sampling")
    mine = [unit for unit in units_dealt(sampling_units(cfg, todo), shards.num_shards, shards.shard_index)
            if not (folder / f"{unit}.json").exists()]
    print(f"sampling: shard {shards.shard_index} of {shards.num_shards}: {len(mine)} units to do "
          f"({', '.join(mine) or 'none'})", flush=True)
    hardware = hardware_fingerprint(torch.device(cfg.device), cfg.dtype)
    opened = {}
    for unit in mine:
        name, part, *index = unit.split(".")
        if name not in opened:
            engine = engine_for(cfg, configuration(name))
            prompts = mixed_prompts([p for d in cfg.datasets for p in prompts_for(cfg, engine.encode, d)],
                                    section(cfg.profile.sampling).prompts_per_dataset * len(cfg.datasets))
            opened = {name: (engine, prompts, table_of(cfg, engine))}
        engine, prompts, table = opened[name]
        extra = {"hardware": hardware, "commit": git_commit()}
        with tqdm(desc=f"sampling {unit}", unit="request", dynamic_ncols=True, mininterval=2) as bar:
            if part == "runs":
                rows, alphas = run_rows(cfg, name, engine, prompts, bar.update)
                extra["alphas"] = {str(t): a for t, a in alphas.items()}
            elif part == "distribution":
                chosen = prompts[int(index[0]):int(index[0]) + 1]
                rows = distribution_rows(cfg, name, engine, chosen, bar.update) if chosen else []
            elif part == "structured":
                rows = structured_rows(cfg, name, engine, Controller(table, controller_config(cfg)), bar.update)
            else:
                rows = long_context_rows(cfg, name, engine, Controller(table, controller_config(cfg)), bar.update)
        write_unit(folder, ShardUnit("sampling", unit, shards.shard_index, shards.num_shards, {part: len(rows)},
                                     table_digest(table), host(), table.to_json(), extra=extra), {part: rows})
    print(f"sampling: shard {shards.shard_index} of {shards.num_shards} done; merge with study.merge_only=true once "
          "every shard is", flush=True)


def merge_sampling(cfg: DictConfig, todo: list[str]) -> None:
    """study.merge_only: the parts' tables, acceptance.json and design.json from the units' files; loads no model."""
    layout = run_layout(cfg)
    units = read_units(layout.stage_units("sampling"), "sampling", sampling_units(cfg, todo))
    digests = {}
    for unit, (record, _) in units.items():
        name = unit.split(".")[0]
        if digests.setdefault(name, record.calibration_digest) != record.calibration_digest:
            raise RakvError(f"sampling: the units of {name} ran under different calibration tables; run the "
                            "calibration job once, then every shard on its tables")
    first = next(iter(units.values()))[0]
    design = read_sampling_design(layout)
    commits = {**(design.parts if design else {}),
               **{part: next(r.extra["commit"] for u, (r, _) in units.items() if u.split(".")[1] == part)
                  for part in todo}}
    write_sampling_design(SamplingDesign(experiment=OmegaConf.to_container(cfg.experiment),
                                         sizes=OmegaConf.to_container(cfg.profile.sampling), parts=commits,
                                         hardware=load_record(Hardware, first.extra["hardware"], "hardware")), layout)
    for part in todo:
        rows, alphas = [], {}
        for unit, (record, by_part) in units.items():
            if unit.split(".")[1] == part:
                rows += by_part[part]
                if "alphas" in record.extra:
                    alphas[unit.split(".")[0]] = record.extra["alphas"]
        if alphas:
            write_atomic(layout.sampling_acceptance, json.dumps(alphas, indent=1))
        write_parquet(rows, layout.sampling_table(part))
        print(f"sampling: wrote {layout.sampling_table(part)} ({len(rows)} rows)", flush=True)
