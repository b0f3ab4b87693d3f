"""A configuration of several proposers in the study (issue 58; conf/configuration/tiny-all.yaml, docs/heads.md):
its plan sweeps every (reuse, proposer, k) action with k = 0 once, every greedy output equals AR, the oracle and the
best fixed action range over proposer-qualified actions, rakv-asd chooses the proposer per request, and a study
resumed from its journal decides as an uninterrupted one. Each check has its positive control."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from rakv.runtime.actions import SPEC_K, Action
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import RunLayout

PROPOSERS = ("draft", "prompt-lookup", "heads")
K_SET = (0, 2, 4, 6)  # 6 is deeper than the tiny heads' 4: the heads are offered no such k
GRID = ["profile=smoke", "configurations=[tiny-all]", "datasets=[humaneval]", "profile.study.prompts_per_bin=2",
        "profile.study.repeats=2", "profile.study.sweep_repeats=2", "profile.study.model_warmup_requests=0",
        "experiment.scenarios=[cold,exact]", "experiment.strategies=[rakv-asd]",
        f"controller.k_set=[{','.join(map(str, K_SET))}]", "calibration.recalibrate=auto"]
# made-up prices per proposer (not measured: a calibration on a loaded test machine is refused as noisy): each has a
# regime where it is the cheapest, so the controller's choice moves between them
PRICES = {"draft": (0.6, 0.0015), "prompt-lookup": (0.3, 0.0), "heads": (0.45, 0.0002)}  # acceptance, propose/token


def composed(*overrides):
    from hydra import compose, initialize_config_dir

    from rakv.experiments.config import CONF_DIR, validate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=GRID + list(overrides))
    validate(cfg)
    return cfg


def seed_tables(folder: Path, cfg) -> None:
    """Each proposer's cost table, saved as the calibration of its key (tests/test_precision_study.py does alike)."""
    from rakv.experiments.config import configuration, engine_for
    from rakv.runtime import calibration
    from rakv.runtime.costmodel import CostTable, Curve

    def flat(seconds):
        return Curve([float(seconds)], 1.0, 0.0)

    engine = engine_for(cfg, configuration("tiny-all"))
    for name, (alpha, propose) in PRICES.items():
        key = calibration.calibration_key(engine.pair, engine.with_proposer(name).proposer)
        step = 0.004
        table = CostTable(key=key, target_prefill=Curve([2e-4, 0.0], 1.0, 0.0), target_step=flat(step),
                          verify={k: flat(1.1 * step + 0.0002 * k) for k in SPEC_K},
                          propose={k: flat(propose * k) for k in SPEC_K},
                          proposer_prefill=Curve([1e-5, 0.0], 1.0, 0.0), kv_copy=Curve([1e-7, 0.0], 1.0, 0.0),
                          target_kv_bytes_per_token=4096.0,
                          proposer_kv_bytes_per_token=2048.0 if name == "draft" else 0.0, acceptance=alpha,
                          acceptance_rounds=100)
        calibration.save_table(table, folder / calibration.calibration_path(key).name)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One tiny-all study (module-wide): its results folder and the calibrations it read."""
    from rakv.experiments.study import run_main_study

    root = tmp_path_factory.mktemp("all")
    tables, results = root / "calibrations", root / "results"
    tables.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAKV_CALIBRATION_DIR", str(tables))
        cfg = composed(f"results_dir={results}")
        seed_tables(tables, cfg)
        run_main_study(cfg)
    return root


def runs_of(root: Path) -> pd.DataFrame:
    return pd.read_parquet(RunLayout.of(root / "results").study.runs)


# --- the configuration and the action labels -------------------------------------------------------------------


def test_the_all_configurations_hold_three_proposers_and_the_single_ones_stay_as_they_were():
    from rakv.experiments.config import configuration

    for name, pair in (("tiny-all", "tiny"), ("smollm2-all", "smollm2")):
        chosen = configuration(name)
        assert chosen.pair == pair and chosen.all_proposers == PROPOSERS and chosen.chooses_proposer
        assert chosen.proposer == "draft"  # the engine's own
    single = configuration("smollm2-heads")
    assert single.all_proposers == ("heads",) and not single.chooses_proposer and single.proposers == ()


def test_a_configuration_names_one_proposer_or_a_list_headed_by_it():
    from rakv.experiments.config import configuration_of
    from rakv.experiments.schema import ConfigurationEntry

    listed = configuration_of("x", ConfigurationEntry(pair="tiny", proposers=["heads", "draft"]))
    assert listed.proposer == "heads" and listed.all_proposers == ("heads", "draft")
    assert configuration_of("x", ConfigurationEntry(pair="tiny", proposer="draft")).all_proposers == ("draft",)
    for bad in (ConfigurationEntry(pair="tiny"), ConfigurationEntry(pair="tiny", proposers=["draft", "draft"]),
                ConfigurationEntry(pair="tiny", proposer="heads", proposers=["draft", "heads"])):
        with pytest.raises(RakvError, match="configuration 'x'"):
            configuration_of("x", bad)


def test_a_proposer_qualified_label_reads_back_and_single_proposer_labels_are_unchanged():
    for label in ("heads:r0k4", "prompt-lookup:r1k8", "draft:r0k1"):
        assert Action.parse(label).label == label
    assert Action.parse("heads:r0k4") == Action(False, 4, "heads") != Action(False, 4)
    assert Action(True, 4).label == "r1k4" and Action.parse("r1k4").proposer == ""
    assert Action(False, 0).of_proposer("heads").label == "r0k0"  # k = 0 runs no proposer
    for bad in ("heads:r0k0", "heads:r0k3", "Heads:r0k4", ":r0k4"):  # positive controls
        with pytest.raises(RakvError):
            Action.parse(bad)


# --- the plan -----------------------------------------------------------------------------------------------------


def plan_problems(runs: pd.DataFrame, proposers=PROPOSERS, k_set=K_SET, limits=None) -> list[str]:
    """What a several-proposer plan lacks or repeats, per (prompt, scenario measured): each proposer's k > 0 actions
    (within its limit), and k = 0 unqualified and once."""
    limits = {"heads": 4} if limits is None else limits
    problems = []
    sweep = runs[runs.kind == "sweep"]
    for (prompt, scenario), group in sweep.groupby(["prompt_id", "scenario"]):
        actions = [Action.parse(s) for s in group[group.repeat == 0].strategy]
        if len(actions) != len(set(actions)):
            problems.append(f"{prompt}/{scenario}: an action planned twice")
        reuses = {a.reuse for a in actions}
        for reuse in reuses:
            k0 = [a for a in actions if a.k == 0 and a.reuse == reuse]
            if len(k0) != 1 or k0[0].proposer:
                problems.append(f"{prompt}/{scenario}: k = 0 (r{int(reuse)}) not planned once, unqualified: {k0}")
            for name in proposers:
                wanted = {k for k in k_set if k and k <= limits.get(name, max(k_set))}
                got = {a.k for a in actions if a.proposer == name and a.reuse == reuse}
                if got != wanted:
                    problems.append(f"{prompt}/{scenario}: {name} r{int(reuse)} k {sorted(got)} != {sorted(wanted)}")
        if any(a.k and a.proposer not in proposers for a in actions):
            problems.append(f"{prompt}/{scenario}: a k > 0 action without one of the proposers")
    return problems


def test_the_plan_holds_each_proposers_actions_and_one_k0_per_scenario(study):
    runs = runs_of(study)
    assert not plan_problems(runs)
    assert {Action.parse(a).proposer for a in runs[runs.kind == "sweep"].strategy} == {"", *PROPOSERS}
    # positive controls: the check sees a proposer dropped, a k = 0 measured per proposer, a heads k beyond its heads
    assert plan_problems(runs[~runs.strategy.str.startswith("heads:")])
    doubled = runs[runs.strategy == "r0k0"].assign(strategy="draft:r0k2")
    assert plan_problems(pd.concat([runs, doubled]))
    assert plan_problems(runs, limits={})


# --- the outputs, the oracle, the choice --------------------------------------------------------------------------


def test_every_greedy_output_equals_ar_and_a_wrong_output_is_caught(study):
    from rakv.experiments.study import mark_equal_to_ar

    runs = runs_of(study)
    assert runs.equal_to_ar.all() and len(runs) > 0
    rows = runs.to_dict("records")
    wrong = next(r for r in rows if r["strategy"].startswith("heads:"))
    wrong["output_hash"] = "0" * 16  # positive control: one heads run with another output
    mark_equal_to_ar(rows)
    assert [r["equal_to_ar"] for r in rows].count(False) == 1 and not wrong["equal_to_ar"]


def test_the_oracle_and_the_best_fixed_action_range_over_proposer_qualified_actions(study):
    from rakv.experiments.oracle import best_fixed_action, controller_choices, measurements, oracle_table

    runs = runs_of(study)
    meas = measurements(runs)
    labels = set(meas.action)
    assert {Action.parse(a).proposer for a in labels} == {"", *PROPOSERS}
    assert set(oracle_table(meas).oracle_action) <= labels
    Action.parse(best_fixed_action(meas))
    choices = controller_choices(runs, meas)
    assert len(choices) == len(runs[runs.strategy == "rakv-asd"]) and choices.regret.notna().all()
    assert set(choices.action) <= labels  # the controller's runs are labelled as the sweep's
    # positive control: make every heads measurement the fastest: the oracle and the best fixed action are heads'
    fast = meas.assign(latency_s=meas.latency_s.where(~meas.action.str.startswith("heads:"), 1e-6))
    assert all(a.startswith("heads:") for a in oracle_table(fast).oracle_action)
    assert best_fixed_action(fast).startswith("heads:")


def test_the_controller_chooses_among_the_proposers_and_records_all_their_state(study):
    runs = runs_of(study)
    own = runs[runs.strategy == "rakv-asd"]
    states = [json.loads(s) for s in own.choice_state]
    assert all(set(s) == set(PROPOSERS) for s in states)
    assert all(len(s["heads"]["tracker"]) == 3 + 2 * max(K_SET) for s in states)  # per position: the heads'
    assert all(len(s["draft"]["tracker"]) == 3 for s in states)
    predictions = json.loads(own.predictions.iloc[0])
    assert not any(label.startswith("heads:") and Action.parse(label).k > 4 for label in predictions)
    assert any(label.startswith("prompt-lookup:") for label in predictions) and "r0k0" in predictions


def test_the_summary_reads_the_best_fixed_proposer_and_k(study):
    from rakv.experiments import analysis

    summary = analysis.summarize(study / "results")
    stats = summary.per_configuration["tiny-all"]
    Action.parse(stats.best_fixed_action)


# --- resume -------------------------------------------------------------------------------------------------------


DECIDED = ["run_id", "action", "predictions", "alpha_before", "alpha_after", "choice_state"]


def resumed(study: Path, target: Path, keep, strip_state: bool = False) -> pd.DataFrame:
    """The study's journal cut to its first `keep` lines (optionally without the journaled choice states), resumed."""
    from rakv.experiments.study import run_main_study

    shutil.copytree(study / "results", target / "results")
    layout = RunLayout.of(target / "results").study
    lines = layout.journal.read_text().splitlines()
    kept = [json.loads(line) for line in lines[:keep]]
    if strip_state:
        for row in kept:
            row.pop("choice_state", None)
    layout.journal.write_text("".join(json.dumps(r) + "\n" for r in kept))
    layout.runs.unlink()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAKV_CALIBRATION_DIR", str(study / "calibrations"))
        run_main_study(composed(f"results_dir={target / 'results'}"))
    return pd.read_parquet(layout.runs)


def test_a_study_resumed_from_its_journal_decides_as_an_uninterrupted_one(study, tmp_path):
    full = runs_of(study)
    lines = RunLayout.of(study / "results").study.journal.read_text().splitlines()
    orders = [json.loads(line) for line in lines]
    # cut after the first half of the controller's runs: those after it decide from the restored state
    asd = [i for i, r in enumerate(orders) if r["strategy"] == "rakv-asd"]
    keep = asd[len(asd) // 2] + 1
    again = resumed(study, tmp_path / "resumed", keep)

    def decided(frame):
        return frame[frame.strategy == "rakv-asd"][DECIDED].sort_values("run_id").reset_index(drop=True)

    pd.testing.assert_frame_equal(decided(again), decided(full))
    # positive control: resumed without the journaled choice states, the later runs decide from the tables' priors
    blind = resumed(study, tmp_path / "blind", keep, strip_state=True)
    assert not decided(blind).equals(decided(full))


def test_learning_per_block_gives_each_block_its_own_choice_of_proposers(study, tmp_path):
    from rakv.experiments.study import run_main_study

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAKV_CALIBRATION_DIR", str(study / "calibrations"))
        run_main_study(composed(f"results_dir={tmp_path}", "study.learning=per_block"))
    runs = pd.read_parquet(RunLayout.of(tmp_path).study.runs)
    own = runs[runs.strategy == "rakv-asd"].sort_values("order")
    assert runs.equal_to_ar.all() and own.choice_state.notna().all()
    assert own.groupby("prompt_id").size().to_dict() == {p: 4 for p in set(runs.prompt_id)}
    # each block (one prompt) starts from the tables: in its first run every proposer that did not run is at its prior
    assert not learnt_elsewhere(own.groupby("prompt_id").head(1))
    # positive control: with one choice over the whole study, a later prompt's first run finds a proposer that
    # learnt from an earlier prompt's runs
    whole = runs_of(study)
    assert learnt_elsewhere(whole[whole.strategy == "rakv-asd"].sort_values("order").groupby("prompt_id").head(1))


def learnt_elsewhere(firsts: pd.DataFrame) -> list[str]:
    """The proposers, in these runs, whose tracker left its prior though they did not run there."""
    moved = []
    for action, state in zip(firsts.action, firsts.choice_state):
        ran = Action.parse(action).proposer
        for name, learned in json.loads(state).items():
            alpha = PRICES[name][0]
            if name != ran and learned["tracker"][:2] != pytest.approx([alpha, 1 - alpha]):
                moved.append(name)
    return moved


# --- the choice judged against fixed choices (rakv.experiments.proposer_choice, scripts/proposer_choice.py) -------


def test_the_choice_is_judged_against_each_workloads_and_each_proposers_best_fixed_action(study):
    from rakv.experiments.oracle import INSTANCE, fixed_action_latencies, measurements, with_hit
    from rakv.experiments.proposer_choice import POOLED, choice_rows

    runs = runs_of(study)
    rows, shares = choice_rows(runs, "tiny-all")
    each = [(POOLED, f"best fixed {p}") for p in sorted(PROPOSERS)]
    versus = [(w, f"{p} vs draft") for w in ("humaneval", POOLED) for p in ("heads", "prompt-lookup")]
    assert [(r.workload, r.baseline) for r in rows] == [("humaneval", "best fixed"), (POOLED, "best fixed"), *each,
                                                        *versus]
    own = runs[runs.strategy == "rakv-asd"]
    assert all(r.instances == len(own) for r in rows[:5]) and all(r.instances > 0 for r in rows[5:])
    for r in rows[5:]:  # each proposer's best fixed action against the first proposer's
        assert r.action.split(" / ")[1].startswith(("draft:", "r")) and r.verdict == "-"
    for r in rows[2:5]:  # each proposer's best fixed action is its own or k = 0
        action = Action.parse(r.action)
        assert action.k == 0 or r.baseline.endswith(action.proposer)
    for workload in ("humaneval", POOLED):
        assert sum(s.share for s in shares if s.workload == workload) == pytest.approx(1.0)
    # positive controls: rakv-asd's runs made exactly 20 % slower, then 10 % faster, than the best fixed action
    meas = measurements(runs[runs.configuration == "tiny-all"])
    best = fixed_action_latencies(meas, Action.parse(rows[1].action), with_hit(meas))[INSTANCE + ["latency_s"]]
    for factor, verdict in ((1.2, "missed"), (0.9, "met")):
        faked = own.drop(columns="latency_s").merge(best.assign(latency_s=best.latency_s * factor), on=INSTANCE)
        changed = pd.concat([runs[runs.strategy != "rakv-asd"], faked], ignore_index=True)
        [_, pooled, *_] = choice_rows(changed, "tiny-all")[0]
        assert pooled.regret.value == pytest.approx(factor - 1) and pooled.verdict == verdict
    # a single-proposer configuration of the pair beside it, whose rakv-asd is 25 % slower on every instance: the
    # choice is judged faster than it on the same instances
    single = own.assign(configuration="tiny", action="r0k4", latency_s=own.latency_s * 1.25)
    [row] = [r for r in choice_rows(pd.concat([runs, single], ignore_index=True), "tiny-all")[0]
             if r.baseline == "rakv-asd of tiny"]
    assert row.instances == len(own) and row.regret.value == pytest.approx(1 / 1.25 - 1) and row.verdict == "met"


def test_the_choice_report_refuses_a_study_without_a_choice_of_proposer(study, tmp_path):
    import subprocess
    import sys

    runs = runs_of(study)
    results = tmp_path / "one"
    RunLayout.of(results).study.runs.parent.mkdir(parents=True)
    runs[runs.action.isna() | ~runs.action.fillna("").str.contains(":")].to_parquet(RunLayout.of(results).study.runs)
    done = subprocess.run([sys.executable, "scripts/proposer_choice.py", str(results)], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "several proposers" in done.stderr
    ok = subprocess.run([sys.executable, "scripts/proposer_choice.py", str(study / "results")], capture_output=True,
                        text=True)
    assert ok.returncode == 0 and "best fixed heads" in ok.stdout


def test_the_shipped_proposer_choice_report_is_what_its_runs_give():
    """data/reference/proposer-choice/: the all-proposer study shipped with its report (scripts/proposer_choice.py's
    output); the report is what its runs give now, and every output equals AR."""
    from rakv.experiments.calibrations import calibration_tables
    from rakv.experiments.proposer_choice import (
        all_proposer_configurations,
        choice_rows,
        prices,
        render,
        render_prices,
    )

    shipped = Path(__file__).resolve().parents[1] / "data" / "reference" / "proposer-choice"
    runs = pd.read_parquet(RunLayout.of(shipped).study.runs)
    assert runs.equal_to_ar.all() and all_proposer_configurations(runs) == ["smollm2-all"]
    text = "\n".join([*(render(*choice_rows(runs, name)) for name in all_proposer_configurations(runs)),
                      render_prices(prices(calibration_tables(shipped), 256))])
    assert (shipped / "proposer_choice.txt").read_text().strip() == text.strip()


def test_the_serving_study_serves_a_configuration_of_several_proposers_choosing_among_them():
    """A serving cell of tiny-all runs rakv-asd over its three proposers (rakv.serving.server.ServeOptions.proposers);
    a single-proposer configuration's cell stays one proposer's."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from rakv.experiments.config import CONF_DIR
    from rakv.experiments.serving import options_of

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=GRID)
    with open_dict(cfg):
        cfg.serving = {k: v for k, v in cfg.serving.items() if k != "trace"}  # (its trace node reads Hydra's run)
    several = options_of(cfg, {"configuration": "tiny-all", "options": {"strategy": "rakv-asd"}}, 50.0)
    assert several.proposers == PROPOSERS and several.strategy == "rakv-asd"
    assert options_of(cfg, {"configuration": "tiny", "options": {"strategy": "rakv-asd"}}, 50.0).proposers == ()


def test_the_served_choice_is_judged_against_the_best_fixed_proposer_with_its_controls():
    """rakv.experiments.served_choice's verdict on made-up runs: a choice as fast as the best fixed proposer meets
    the 5 % regret goal, one 20 % slower misses it, one 5 % slower with noisy latencies is inconclusive; the best
    fixed is the one of least mean latency."""
    import numpy as np

    from rakv.experiments.served_choice import CHOICE, ServedProposersOptions, SetupRuns, report_of

    rng = np.random.default_rng(0)
    base = [{f"r{i}": float(v) for i, v in enumerate(rng.uniform(1.0, 3.0, 40))} for _ in range(3)]

    def runs(scale, noise=0.02):
        return SetupRuns([{i: v * scale * rng.lognormal(0.0, noise) for i, v in run.items()} for run in base],
                         [10.0, 10.0, 10.0])

    options = ServedProposersOptions(pair="tiny")
    for scale, noise, verdict in ((1.0, 0.02, "met"), (1.2, 0.02, "missed"), (1.05, 0.3, "inconclusive")):
        report = report_of(options, {"draft": runs(1.0), "prompt-lookup": runs(1.3), "heads": runs(1.1),
                                     CHOICE: runs(scale, noise)})
        assert report.best_fixed == "draft" and report.verdict == verdict, (scale, report.regret)
        assert report.against["prompt-lookup"][0] < report.against["draft"][0]


def test_the_papers_proposer_section_is_the_shipped_studys_rows_and_served_report(tmp_path):
    """paper/generated/*/proposers.tex (rakv.experiments.prose_proposers): every row of the shipped all-proposer
    study's choice table with its interval and verdict (the analysed run's own study where it has one), the served
    choice's verdict where its report is shipped, and a comment alone without a study."""
    from rakv.experiments.formatting import ci_text
    from rakv.experiments.prose_proposers import PROPOSER_STUDY, proposers_section, study_rows

    configuration, rows, _ = study_rows(PROPOSER_STUDY.root)
    from dataclasses import replace

    from rakv.experiments.served_choice import CHOICE, ProposerService, ServedProposersOptions, SetupRuns, report_of
    from rakv.runtime.json_records import write_record

    served = tmp_path / "served"
    served.mkdir()
    base = [{f"r{i}": 1.0 + i / 10 for i in range(10)}] * 3

    def runs(scale, jitter=0.0):
        return SetupRuns([{i: v * scale * (1 + jitter * (j % 2)) for i, v in run.items()} for j, run in
                          enumerate(base)], [10.0] * 3, {"draft": 30}, 30, 30)

    for rate, scale, jitter in ((6.0, 1.05, 0.3), (2.0, 1.0, 0.0)):
        draft = runs(1.0)
        if rate == 2.0:  # admission's predictions beside the service measured, per proposer (only this report's)
            draft.service = {"draft": ProposerService(30, 30.0, 39.0, 27.0, 28.5, 30)}
        report = report_of(replace(ServedProposersOptions(), rate=rate, repeats=3),
                           {"draft": draft, "prompt-lookup": runs(1.2), "heads": runs(1.3),
                            CHOICE: runs(scale, jitter)})
        write_record(report, served / f"rate{rate:g}.json")
    text = proposers_section(served=served)
    assert text.count("over admission's prediction was 1.30 for draft (acceptance priced 0.900, realised 0.950)") == 1
    assert configuration == "smollm2-all" and all(ci_text(r.regret) in text for r in rows)
    assert text.index("at 2 requests/s") < text.index("regret is met") < text.index("at 6 requests/s") < text.index(
        "regret is inconclusive")
    assert "served" not in proposers_section(served=tmp_path / "none").lower()
    assert "data/reference/proposer-choice/" in text and "predates" in text
    assert proposers_section(tmp_path, shipped=tmp_path).startswith("% no study")
    # a run whose own study holds a configuration of several proposers (the offline profile's) is read instead
    own = proposers_section(PROPOSER_STUDY.root, served=served, shipped=tmp_path)
    assert "this run's study" in own and "predates" not in own and all(ci_text(r.regret) in own for r in rows)


def test_the_shipped_served_choice_reports_are_what_their_runs_give():
    """data/reference/served-choice/*.json (scripts/served_choice.py --out): each report's intervals, best fixed
    proposer and verdict are what rakv.experiments.served_choice computes today from the runs it carries, every
    greedy output was equal across the setups, and the load is the one its name says."""
    from rakv.experiments.served_choice import read_report, report_of
    from rakv.runtime.run_layout import RunLayout

    paths = sorted(RunLayout.reference("served-choice").root.glob("*.json"))
    assert [p.stem for p in paths] == ["rate2", "rate6"]
    for path in paths:
        report = read_report(path)
        again = report_of(report.options, report.setups)
        assert (again.regret, again.against, again.best_fixed, again.verdict) == (
            report.regret, report.against, report.best_fixed, report.verdict), path.name
        assert path.stem == f"rate{report.options.rate:g}"
        assert all(s.equal == s.total == report.options.requests * report.options.repeats
                   for s in report.setups.values())


def test_the_ablation_replays_the_choice_among_the_proposers(study):
    """rakv.experiments.ablation replays a configuration of several proposers with their ProposerChoice, each priced
    by its own calibration: one replayed run per live one, each a proposer-qualified action the study measured, the
    first decision (nothing learnt yet) the live one's, the heads offered no k deeper than their heads, and
    `k_set=[0]` never speculating. The ablation table, from the study folder's calibrations, holds it under every
    variant."""
    from dataclasses import replace

    from rakv.experiments.ablation import LIVE, ablation_table, replay, replay_controller, replay_tables, replayable
    from rakv.experiments.calibrations import proposer_tables
    from rakv.experiments.metadata import read_run_metadata
    from rakv.experiments.oracle import adaptive_mask, measurements
    from rakv.runtime.controller import ControllerConfig, ProposerChoice

    runs, results = runs_of(study), study / "results"
    tables = proposer_tables(runs, results, "tiny-all")
    assert list(tables) == list(PROPOSERS) and None not in tables.values()
    config = ControllerConfig.from_conf(read_run_metadata(RunLayout.of(results)).controller)
    meas = measurements(runs)
    part = meas[meas.configuration == "tiny-all"]
    controller = replay_controller(tables, config, part)
    assert isinstance(controller, ProposerChoice) and controller.max_k == {"heads": 4}
    live = runs[adaptive_mask(runs, "tiny-all")].sort_values("order")
    replayed = replay(runs, meas, tables, config, "tiny-all").sort_values("order")
    assert len(replayed) == len(live) and set(replayed.action) <= set(part.action)
    assert replayed.action.iloc[0] == live.action.iloc[0]
    assert not any(a.startswith("heads:") and Action.parse(a).k > 4 for a in replayed.action)
    assert {Action.parse(a).proposer for a in replayed.action if ":" in a} - {""}  # it speculates with some proposer
    never = replay(runs, meas, tables, replace(config, k_set=(0,)), "tiny-all")
    assert (never.k == 0).all()
    variants = {LIVE: None, "as run": replayable(config), "tie 10 %": replace(replayable(config), tie_margin=0.1)}
    table = ablation_table(runs, replay_tables(runs, results), variants, config)
    assert list(table.variant) == list(variants) and set(table.configuration) == {"tiny-all"}


def test_a_configuration_of_several_proposers_has_no_acceptance_row_of_mixed_proposers(study):
    """rakv.experiments.study_stats.acceptance_table leaves out a configuration whose speculative runs mix proposers
    (each proposer's acceptance is its single-proposer configuration's row); control: the same runs with their
    labels unqualified, as a configuration of one proposer records them, get their row."""
    from rakv.experiments.study_stats import acceptance_table

    runs = runs_of(study)
    assert "tiny-all" not in set(acceptance_table(runs, {}).get("configuration", []))
    single = runs.assign(action=runs.action.str.replace(r"^[a-z-]+:", "", regex=True))
    assert set(acceptance_table(single, {}).configuration) == {"tiny-all"}
