"""Precision as a factor of the study (issue 62): configurations at fp32 and q4_1 of one pair and proposer keep
apart calibrations, the study runs a target at q4_1 through its plumbing (the tiny pair, quantised at load), and the
analysis sets each proposer's regime at the two precisions side by side."""



from pathlib import Path

import pandas as pd
import pytest

from rakv.runtime.run_layout import RunLayout, calibration_stem, split_calibration_stem


def test_the_calibrations_of_one_pair_and_proposer_at_two_precisions_never_share_a_file(tmp_path):
    layout = RunLayout.of(tmp_path)
    fp32, q4 = layout.calibration("smollm2", "draft"), layout.calibration("smollm2", "draft", "q4_1")
    assert fp32.name == "smollm2-draft.json"  # the shipped runs' names stay
    assert q4 != fp32 and q4.name == "smollm2-draft@q4_1.json"
    assert layout.calibration("smollm2", "draft", "int8") not in (fp32, q4)
    for pair, proposer, precision in (("smollm2", "prompt-lookup", "q4_1"), ("tiny", "draft", "fp32")):
        assert split_calibration_stem(calibration_stem(pair, proposer, precision)) == (f"{pair}-{proposer}",
                                                                                        precision)


def test_a_configurations_calibration_is_keyed_by_its_precision():
    from rakv.experiments.calibrations import configuration_stem

    assert configuration_stem("smollm2") == "smollm2-draft"
    assert configuration_stem("smollm2-q4_1") == "smollm2-draft@q4_1"
    assert configuration_stem("smollm2-lookup-q4_1") == "smollm2-prompt-lookup@q4_1"
    assert configuration_stem("smollm2-lookup") != configuration_stem("smollm2-lookup-q4_1")


def test_a_calibration_records_what_the_kernels_compile_for():
    import torch

    from rakv.runtime.calibration import hardware_fingerprint
    from rakv.runtime.kernels import target_isa

    record = hardware_fingerprint(torch.device("cpu"), "float32")
    assert record["kernels_isa"] == target_isa() and record["kernels_isa"].count("+") == 1
    assert record["kernels_march"]  # beside the -march string it resolves


def test_the_precision_a_loaded_pair_runs_at_is_read_off_its_target():
    from rakv.runtime.calibration import precision_of
    from rakv.runtime.models import load_pair

    assert precision_of(load_pair("tiny")) == "fp32"
    assert precision_of(load_pair("tiny", precision="q4_1")) == "q4_1"
    assert precision_of(load_pair("tiny", precision="int8")) == "int8"


# --- the analysis: each pair and proposer at each precision, side by side -------------------------------------------

REFERENCE = RunLayout.reference("offline")


def scaled(table, factor: float):
    """A cost table whose target prices (step, verify, prefill) are `factor` times `table`'s: another precision's."""
    from dataclasses import replace

    def times(curve):
        return replace(curve, coefficients=[c * factor for c in curve.coefficients],
                       ys=[y * factor for y in curve.ys])

    return replace(table, target_step=times(table.target_step), target_prefill=times(table.target_prefill),
                   verify={k: times(v) for k, v in table.verify.items()})


def with_q4_1(summary, regime: list):
    """The shipped summary with smollm2-q4_1 (added where the run lacks it) carrying smollm2's statistics, but the
    regime's CI `regime`."""
    from dataclasses import replace

    from rakv.runtime.json_records import CI

    fp32 = summary.per_configuration["smollm2"]
    q4 = replace(fp32, spec_slowdown=replace(fp32.spec_slowdown, pooled=CI(*regime)))
    names = list(summary.configurations)
    if "smollm2-q4_1" not in names:
        names.append("smollm2-q4_1")
    return replace(summary, configurations=names, per_configuration={**summary.per_configuration, "smollm2-q4_1": q4})


def only(summary, names: list[str]):
    """The summary restricted to the configurations `names`."""
    from dataclasses import replace

    return replace(summary, configurations=list(names),
                   per_configuration={n: summary.per_configuration[n] for n in names})


@pytest.fixture(scope="module")
def shipped():
    from rakv.experiments.analysis import price_context
    from rakv.experiments.calibrations import calibration_tables
    from rakv.experiments.summary import read_summary

    tables = calibration_tables(REFERENCE.root)
    tables["smollm2-draft@q4_1"] = scaled(tables["smollm2-draft"], 0.5)
    return read_summary(REFERENCE.root), tables, price_context(REFERENCE.root)


def test_each_precision_row_of_the_shipped_run_reads_its_own_calibration_and_one_precision_gives_none():
    """The shipped run's rows: each configuration's prices from the calibration kept for its precision; the same
    run restricted to its fp32 configurations has no row and its table says so (control)."""
    from rakv.experiments.analysis import price_context
    from rakv.experiments.calibrations import calibration_tables, configuration_stem
    from rakv.experiments.config import configuration
    from rakv.experiments.precision_factor import precision_rows, precision_sentences, precision_table
    from rakv.experiments.summary import read_summary

    summary, tables = read_summary(REFERENCE.root), calibration_tables(REFERENCE.root)
    context = price_context(REFERENCE.root)
    rows = precision_rows(summary, tables, context)
    precisions = {configuration(n).precision for n in summary.configurations}
    assert bool(rows) == (len(precisions) > 1)
    for row in rows:
        assert row.precision == configuration(row.configuration).precision
        table = tables[configuration_stem(row.configuration)]
        assert row.step_ms == pytest.approx(1e3 * table.target_step(context))
    fp32 = [n for n in summary.configurations if configuration(n).precision == "fp32"]
    assert precision_rows(only(summary, fp32), tables, context) == []
    assert precision_table([]).startswith("%") and "\\begin" not in precision_table([])
    assert precision_sentences([]) == []


def test_a_pair_at_two_precisions_gets_a_row_each_with_its_own_prices(shipped):
    from rakv.experiments.precision_factor import precision_rows, precision_table

    summary, tables, context = shipped
    rows = [r for r in precision_rows(with_q4_1(summary, [0.2, 0.1, 0.3]), tables, context)
            if r.family == "smollm2-draft"]
    assert [(r.configuration, r.precision, r.family) for r in rows] == [("smollm2", "fp32", "smollm2-draft"),
                                                                          ("smollm2-q4_1", "q4_1", "smollm2-draft")]
    fp32, q4 = rows
    assert q4.step_ms == pytest.approx(fp32.step_ms / 2)  # the q4_1 table's prices, not the fp32 one's
    assert q4.draft_ratio == pytest.approx(2 * fp32.draft_ratio)  # the same draft against a target half as dear
    assert q4.verify_ratio == pytest.approx(fp32.verify_ratio)
    assert fp32.regime == list(summary.per_configuration["smollm2"].spec_slowdown.pooled) and q4.regime[0] == 0.2
    table = precision_table(rows)
    assert table.count("\\\\\n") >= 3 and "tab:precision" in table and "smollm2-q4\\_1" in table


def test_the_precision_sentence_follows_the_sign_of_the_regimes_interval(shipped):
    """Positive control: the same run with the q4_1 regime's CI above zero, straddling it and below it gets the
    three verdicts, and the comparison with fp32 (faster there: the shipped run) turns with them."""
    from rakv.experiments.precision_factor import precision_rows, precision_sentences, regime_word

    summary, tables, context = shipped
    assert regime_word(list(summary.per_configuration["smollm2"].spec_slowdown.pooled)) == "faster"

    def sentence(regime):
        rows = [r for r in precision_rows(with_q4_1(summary, regime), tables, context) if r.family == "smollm2-draft"]
        (text,) = precision_sentences(rows)
        return text.split("at q4\\_1")[1]

    slower, neither, faster = sentence([0.2, 0.1, 0.3]), sentence([0.02, -0.05, 0.1]), sentence([-0.2, -0.3, -0.1])
    assert "is slower than the best $k=0$" in slower and "differs between the precisions" in slower
    assert "is not distinguishable from the best $k=0$" in neither and "differs" in neither
    assert "is faster than the best $k=0$" in faster and "the same at every precision (faster)" in faster
    assert "20.0\\%" in slower and "[10.0\\%, 30.0\\%]" in slower


def test_the_regime_maps_points_name_their_precision():
    from rakv.experiments.figures import pair_name

    assert pair_name("smollm2-draft") == "smollm2 (int8 self-draft)"
    assert pair_name("smollm2-draft@q4_1") == "smollm2 (int8 self-draft) at q4_1"
    assert pair_name("smollm2-prompt-lookup@q4_1") != pair_name("smollm2-prompt-lookup")


# --- the study's plumbing at a precision other than fp32 (the tiny pair, its target quantised to q4_1 at load) ------

GRID = ["profile=smoke", "configurations=[tiny,tiny-q4_1]", "datasets=[humaneval]", "profile.study.prompts_per_bin=2",
        "profile.study.sweep_repeats=1", "profile.study.model_warmup_requests=0", "experiment.scenarios=[cold,exact]",
        "experiment.strategies=[rakv-asd]", "controller.k_set=[0,4]", "calibration.recalibrate=auto"]
SEEDED_STEP = {"tiny": 0.004, "tiny-q4_1": 0.002}  # made-up target steps: each configuration's table is told apart


def composed(*overrides):
    from hydra import compose, initialize_config_dir

    from rakv.experiments.config import CONF_DIR, validate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=GRID + list(overrides))
    validate(cfg)
    return cfg


def seed_table(folder: Path, cfg, name: str):
    """A cost table for configuration `name` on this machine, saved as the calibration of its key (not measured: a
    calibration on a loaded test machine is refused as noisy; tests/test_sharding.py seeds its table alike)."""
    from rakv.experiments.config import configuration, engine_for
    from rakv.runtime import calibration
    from rakv.runtime.costmodel import CostTable, Curve

    def flat(seconds):
        return Curve([float(seconds)], 1.0, 0.0)

    engine = engine_for(cfg, configuration(name))
    key = calibration.calibration_key(engine.pair, engine.proposer)
    step = SEEDED_STEP[name]
    table = CostTable(key=key, target_prefill=Curve([2e-4, 0.0], 1.0, 0.0), target_step=flat(step),
                      verify={k: flat(1.1 * step + 0.0002 * k) for k in (1, 2, 4, 6, 8)},
                      propose={k: flat(0.0004 * k) for k in (1, 2, 4, 6, 8)},
                      proposer_prefill=Curve([1e-5, 0.0], 1.0, 0.0), kv_copy=Curve([1e-7, 0.0], 1.0, 0.0),
                      target_kv_bytes_per_token=4096.0, proposer_kv_bytes_per_token=2048.0, acceptance=0.5,
                      acceptance_rounds=100)
    calibration.save_table(table, folder / calibration.calibration_path(key).name)
    return key


def test_a_study_at_fp32_and_q4_1_keeps_two_calibrations_and_the_analysis_sets_them_side_by_side(tmp_path,
                                                                                                   monkeypatch):
    from rakv.experiments import analysis
    from rakv.experiments.calibrations import tables_by_configuration
    from rakv.experiments.precision_factor import precision_rows_of, precision_table
    from rakv.experiments.study import run_main_study
    from rakv.runtime.costmodel import read_cost_table

    tables, results = tmp_path / "calibrations", tmp_path / "results"
    tables.mkdir()
    monkeypatch.setenv("RAKV_CALIBRATION_DIR", str(tables))
    cfg = composed(f"results_dir={results}")
    keys = {name: seed_table(tables, cfg, name) for name in SEEDED_STEP}
    assert keys["tiny"] != keys["tiny-q4_1"]  # the target's quantisation is part of the key
    run_main_study(cfg)

    layout = RunLayout.of(results)
    kept = {path.name: read_cost_table(path) for path in layout.calibrations()}
    assert set(kept) == {"tiny-draft.json", "tiny-draft@q4_1.json"}
    assert kept["tiny-draft@q4_1.json"].target_step(100) == SEEDED_STEP["tiny-q4_1"]
    runs = pd.read_parquet(layout.study.runs)
    assert set(runs.configuration) == set(SEEDED_STEP) and runs.equal_to_ar.all()  # each against AR at its precision
    # k = 0 actions (AR among them) are shared within one pair and precision only: each precision measures its own,
    # and the oracle reads each configuration's k = 0 prices from its own precision's runs
    k0 = runs[(runs.kind == "sweep") & (runs.k == 0)]
    assert set(k0.configuration) == set(SEEDED_STEP) and dict(zip(runs.configuration, runs.precision)) == {
        "tiny": "fp32", "tiny-q4_1": "q4_1"}
    from rakv.experiments.oracle import measurements

    meas = measurements(runs)
    assert (meas[(meas.configuration == "tiny-q4_1") & (meas.k == 0)].precision == "q4_1").all()
    assert (meas[(meas.configuration == "tiny") & (meas.k == 0)].precision == "fp32").all()
    by_configuration = tables_by_configuration(runs, results)
    assert {name: t.target_step(100) for name, t in by_configuration.items()} == SEEDED_STEP

    summary = analysis.summarize(results)
    assert set(summary.per_configuration) == set(SEEDED_STEP)
    assert {r.configuration for r in summary.claims if r.key == "spec_regime"} <= set(SEEDED_STEP)
    rows = precision_rows_of(summary, results)
    assert [(r.configuration, r.precision) for r in rows] == [("tiny", "fp32"), ("tiny-q4_1", "q4_1")]
    assert rows[0].step_ms == pytest.approx(2 * rows[1].step_ms)
    assert "tiny-q4\\_1" in precision_table(rows)


def test_the_within_run_band_of_prices_is_the_fp32_targets_alone(tmp_path):
    """One run calibrates the fp32 target once per configuration: the band of verify-4 / step those calibrations
    span is the fp32 target's, and a q4_1 target's calibration in the same run (another target) does not widen it."""
    import shutil
    from dataclasses import replace

    from rakv.experiments.prose_machines import calibration_band, machine_costs
    from rakv.runtime.calibration import save_table
    from rakv.runtime.costmodel import read_cost_table

    folder = tmp_path / "run"
    for part in ("calibration", "study"):
        shutil.copytree(REFERENCE.root / part, folder / part)
    before = calibration_band(folder)
    assert before is not None
    fp32 = read_cost_table(RunLayout.of(folder).calibration("smollm2", "draft"))
    dearer = replace(fp32, verify={k: replace(v, coefficients=[3 * c for c in v.coefficients], ys=[3 * y for y in v.ys])
                                   for k, v in fp32.verify.items()})
    save_table(dearer, RunLayout.of(folder).calibration("smollm2", "draft", "q4_1"))
    assert machine_costs(folder)["smollm2-draft@q4_1"]["verify4"] > 2 * before[1]  # it is read, and it is far out
    assert calibration_band(folder) == before
    save_table(dearer, RunLayout.of(folder).calibration("smollm2", "heads"))  # positive control: an fp32 one widens it
    assert calibration_band(folder)[1] > 2 * before[1]


def test_a_configuration_of_several_proposers_gets_no_precision_row(shipped):
    """The configuration of all three proposers (its engine's proposer the self-draft, at fp32) would otherwise join
    the self-draft's family as a second fp32 row: it gets none, and the other rows stay as they were."""
    from dataclasses import replace

    from rakv.experiments.config import configuration
    from rakv.experiments.precision_factor import precision_rows

    summary, tables, context = shipped
    summary = with_q4_1(summary, [0.2, 0.1, 0.3])
    assert configuration("smollm2-all").proposer == "draft" and configuration("smollm2-all").precision == "fp32"
    names = [n for n in summary.configurations if n != "smollm2-all"]
    without = only(summary, names)
    held = replace(without, configurations=[*names, "smollm2-all"],
                   per_configuration={**without.per_configuration, "smollm2-all": summary.per_configuration["smollm2"]})
    assert precision_rows(held, tables, context) == precision_rows(without, tables, context) != []
