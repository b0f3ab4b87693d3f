"""scripts/compare_runs.py: two runs' headline statistics, their differences tested with both runs' uncertainty."""

import importlib.util
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from rakv.experiments.metadata import Hardware, read_run_metadata, write_run_metadata
from rakv.runtime.run_layout import OTHER_MACHINES_DIR, RunLayout

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_runs.py"
LAYOUT = RunLayout.reference("offline")
REFERENCE = LAYOUT.root
MOVED = "per_configuration.smollm2.latency_reduction.joint-k4"
spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
compare_runs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_runs)


def summary(latency, worst_regret=0.2) -> dict:
    """The shipped reference run's summary.json with one interval (smollm2's latency reduction against Joint-k4) and
    one statistic without an interval (its worst regret) set."""
    content = json.loads(LAYOUT.summary.read_text())
    content.pop("replication", None)  # the shipped runs' pooling: not these made-up runs'
    statistics = content["per_configuration"]["smollm2"]
    statistics["latency_reduction"]["joint-k4"], statistics["worst_regret"] = latency, worst_regret
    return content


def write(folder: Path, content: dict) -> Path:
    folder.mkdir()
    RunLayout.of(folder).summary.write_text(json.dumps(content))
    return folder


FAR = [0.50, 0.48, 0.52]  # far from A's [0.10, 0.04, 0.17] with both runs' uncertainty: significant after Holm


def test_only_a_significant_difference_fails(tmp_path, capsys):
    """Outside A's CI is no evidence (an exact replication lands there about one time in seven); a difference
    significant with both runs' uncertainty, Holm-adjusted, is."""
    a = write(tmp_path / "a", summary([0.10, 0.04, 0.17]))
    inside = write(tmp_path / "inside", summary([0.12, 0.05, 0.2], worst_regret=0.25))
    outside = write(tmp_path / "outside", summary([0.01, -0.06, 0.08]))
    far = write(tmp_path / "far", summary(FAR))
    assert compare_runs.main([str(a), str(inside)]) == 0
    assert "+25.0%" in capsys.readouterr().out
    assert compare_runs.main([str(a), str(outside)]) == 0
    out = capsys.readouterr().out
    assert "outside A's 95% confidence interval" in out and MOVED in out and "0 of" in out
    assert compare_runs.main([str(a), str(far)]) == 1
    out = capsys.readouterr().out
    assert "1 of" in out and f"differ significantly (both runs' uncertainty, Holm 5 %): {MOVED}" in out


def test_the_difference_test_holds_its_level_on_replications():
    """Simulated exact replications (each run's estimate drawn with its own error and its CI from 8 prompts): the
    difference test rejects about 5 % of single statistics before Holm, and B lies in A's CI at the expected
    rate (replication.inside_rate_expected)."""
    import numpy as np
    from scipy import stats

    from rakv.experiments import replication

    rng, df, q = np.random.default_rng(0), 7, stats.t.ppf(0.975, 7)
    rejected = inside = trials = 0
    for _ in range(4000):
        cis = []
        for _ in range(2):
            sample = rng.normal(0.0, 1.0, df + 1)
            half = q * sample.std(ddof=1) / np.sqrt(df + 1)
            cis.append([sample.mean(), sample.mean() - half, sample.mean() + half])
        d = replication.differences({"x": cis[0]}, {"x": cis[1]}, df)[0]
        rejected += d.p < 0.05
        inside += d.inside
        trials += 1
    assert 0.03 < rejected / trials < 0.07
    assert abs(inside / trials - replication.inside_rate_expected(df)) < 0.02


def with_metadata(folder: Path, commit: str | None = None, processor: str = "CPU X", **hardware) -> Path:
    """`folder` with the shipped reference run's study metadata, its commit and machine replaced (the machine's
    fields not given are left unrecorded, as in a record written before they existed)."""
    layout = RunLayout.of(folder)
    layout.study.root.mkdir()
    machine = Hardware(processor=processor, device="cpu", dtype="float32", threads=2, torch="2", transformers="5",
                       **hardware)
    write_run_metadata(replace(read_run_metadata(LAYOUT), git_commit=commit, hardware=machine), layout.study)
    return folder


def with_hardware(folder: Path, processor: str, isa: str | None = None, **more) -> Path:
    return with_metadata(folder, None, processor, isa=isa, **more)


def test_outside_on_the_same_hardware_fails_and_on_other_hardware_is_reported(tmp_path, capsys):
    a = with_hardware(write(tmp_path / "a", summary([0.10, 0.04, 0.17])), "CPU X")
    same = with_hardware(write(tmp_path / "same", summary(FAR)), "CPU X")
    other = with_hardware(write(tmp_path / "other", summary(FAR)), "CPU Y")
    assert compare_runs.main([str(a), str(same)]) == 1
    out = capsys.readouterr().out
    total = len(compare_runs.with_intervals(compare_runs.read_summary(a)))
    assert f"1 of {total} statistic(s) of B outside A's 95% confidence interval" in out
    assert "CPU X (cpu, 2 threads, float32)" in out and "different hardware" not in out
    assert compare_runs.main([str(a), str(other)]) == 0
    out = capsys.readouterr().out
    assert "CPU Y" in out and "different hardware" in out


def test_one_processor_name_with_two_instruction_sets_is_other_hardware(tmp_path, capsys):
    """Two machines sold as 'AMD EPYC', one with AVX-512 and one without, price a round differently."""
    a = with_hardware(write(tmp_path / "a", summary([0.10, 0.04, 0.17])), "AMD EPYC", "avx2+fma+avx512f")
    b = with_hardware(write(tmp_path / "b", summary(FAR)), "AMD EPYC", "avx2+fma")
    assert compare_runs.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "AMD EPYC (cpu, avx2+fma, 2 threads, float32)" in out and "different hardware" in out


def test_the_same_name_and_isa_with_other_caches_or_compile_target_is_other_hardware(tmp_path, capsys):
    """Cores, caches and the kernels' -march change the kernels' blocking or code path; a record written before
    those fields existed is compared on the fields it has."""
    kw = dict(kernels_march="native", cores=2, caches="L1d 32K, L2 512K, L3 32768K")
    a = with_hardware(write(tmp_path / "a", summary([0.10, 0.04, 0.17])), "AMD EPYC", "avx2+fma", **kw)
    caches = with_hardware(write(tmp_path / "b", summary(FAR)), "AMD EPYC", "avx2+fma",
                           **{**kw, "caches": "L1d 32K, L2 1024K, L3 16384K"})
    march = with_hardware(write(tmp_path / "c", summary(FAR)), "AMD EPYC", "avx2+fma",
                          **{**kw, "kernels_march": "x86-64-v3"})
    older = with_hardware(write(tmp_path / "d", summary(FAR)), "AMD EPYC", "avx2+fma")
    assert compare_runs.main([str(a), str(caches)]) == 0 and "different hardware" in capsys.readouterr().out
    assert compare_runs.main([str(a), str(march)]) == 0
    out = capsys.readouterr().out
    assert "x86-64-v3" in out and "different hardware" in out
    assert compare_runs.main([str(a), str(older)]) == 1  # the fields both have agree: the same machine class
    assert "2 cores" in capsys.readouterr().out


def test_this_machines_record_names_its_cores_caches_and_compile_target():
    import torch

    from rakv.runtime.calibration import hardware_fingerprint

    record = hardware_fingerprint(torch.device("cpu"), "float32")
    assert record["cores"] >= 1 and record["kernels_march"]
    assert record["caches"] is None or record["caches"].startswith("L1")


def test_unreadable_input_is_a_one_line_error(tmp_path, capsys):
    assert compare_runs.main([str(tmp_path / "nowhere"), str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    old = summary([0.10, 0.04, 0.17])
    del old["claims"][3]["direction"]  # a summary.json from before a field, or edited by hand
    assert compare_runs.main([str(write(tmp_path / "old", old)), str(tmp_path / "old")]) == 2
    assert "missing field 'claims[3].direction'" in capsys.readouterr().err


def test_agreement_counts_values_inside_and_conclusions_that_flip(tmp_path):
    from rakv.experiments.runcompare import agreement
    from rakv.experiments.summary import read_summary

    a = read_summary(write(tmp_path / "a", summary([0.10, 0.04, 0.17])))
    same = agreement(a, read_summary(write(tmp_path / "same", summary([0.12, 0.05, 0.2]))))
    assert same.inside == same.total and same.same_conclusion == same.total and not same.flipped
    moved = agreement(a, read_summary(write(tmp_path / "moved", summary([0.20, 0.18, 0.22]))))
    assert moved.outside == [MOVED] and not moved.flipped  # outside A's CI, the same conclusion (above 0)
    flipped = agreement(a, read_summary(write(tmp_path / "flip", summary([0.01, -0.06, 0.08]))))
    assert flipped.outside == [MOVED] == flipped.flipped and flipped.inside == flipped.total - 1


@pytest.mark.heavy
def test_the_paper_sets_the_shipped_other_machines_side_by_side():
    from rakv.experiments import prose_machines

    text = prose_machines.across_machines(REFERENCE)
    assert "\\label{tab:machines}" in text and "AVX-512" in text and "this run" in text
    assert text.count("smollm2-draft") >= 3  # one price row per machine and this run


def test_the_papers_run_to_run_sentence_reads_a_shipped_second_run(tmp_path):
    """A second run of the same commit and machine class beside this one is read: its significant differences, the
    conclusions that flip, the run-level variance and the held-out coverage; one of another commit is not."""
    from rakv.experiments import prose_machines

    def metadata(folder: Path, commit: str) -> Path:
        return with_metadata(folder, commit)

    first = metadata(write(tmp_path / "offline", summary([0.10, 0.04, 0.17])), "abc")
    assert "No second full run" in prose_machines.run_to_run(first)
    metadata(write(tmp_path / "offline-rerun", summary([0.01, -0.06, 0.08])), "def")
    assert "No second full run" in prose_machines.run_to_run(first)  # another commit: not a rerun of this one
    shutil.rmtree(tmp_path / "offline-rerun")
    metadata(write(tmp_path / "offline-rerun", summary([0.01, -0.06, 0.08])), "abc")
    text = prose_machines.run_to_run(first)
    total = len(compare_runs.with_intervals(compare_runs.read_summary(first)))
    assert f"0 of {total} headline statistics' differences are significant" in text
    assert "lies on): smollm2: latency reduction vs joint-k4" in text
    assert f"for {2 * total - 2} of {2 * total} statistics" in text  # the moved one is outside both ways


def shipped_compare_files() -> list[Path]:
    runs = [*LAYOUT.reruns(), *RunLayout.other_machines(OTHER_MACHINES_DIR)]
    return [run.root for run in runs if run.summary.exists()]


def test_every_shipped_compare_file_is_todays_comparison_and_the_papers(monkeypatch, capsys):
    """Each shipped run beside the reference carries compare_reference.txt, exactly what compare_runs prints against
    today's reference (scripts/write_compare_files.sh); the paper's run-to-run paragraph counts the same
    significant differences as the rerun's file."""
    from rakv.runtime.paths import ROOT

    monkeypatch.chdir(ROOT)
    runs = shipped_compare_files()
    assert runs
    for run in runs:
        relative = run.relative_to(ROOT)
        compare_runs.main([str(REFERENCE.relative_to(ROOT)), str(relative)])
        assert RunLayout.of(run).compare_reference.read_text() == capsys.readouterr().out, \
            f"{relative}/compare_reference.txt is stale: ./scripts/write_compare_files.sh"
    from rakv.experiments.runcompare import commit_of, sibling_runs

    rerun = RunLayout.reference("offline-rerun")
    paper = (LAYOUT.generated / "run_to_run.tex").read_text()
    if rerun.root in sibling_runs(REFERENCE):  # a rerun of the reference's commit and machine class: pooled
        line = next(x for x in rerun.compare_reference.read_text().splitlines() if "differ significantly" in x)
        counted = line.split("compare_runs: ")[1].split(" statistic(s)")[0]  # "N of M"
        assert f"{counted} headline statistics' differences are significant" in paper
    else:  # a rerun of other code: named with its commit, compared and not pooled
        assert f"(commit {commit_of(rerun.root)[:7]})" in paper and "no interval is pooled over runs" in paper
        assert "differences are significant" not in paper
