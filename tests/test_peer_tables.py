"""The vLLM peer's shipped numbers and how they are shown (rakv.experiments.peer_tables): the statistics over
repeats, the reading of tune_vllm's check against its own noise, and docs/peers.md's tables current with the shipped
files in data/reference/peer/ (scripts/peer_tables.py)."""

import json
import math
import re

import pytest
from scipy import stats

from rakv.bench.peer_reports import (
    SERVE_METRICS,
    ClientRun,
    RepeatRecord,
    ServingBenchReport,
    TuneReport,
    VllmServeSummary,
)
from rakv.experiments import peer_tables as pt
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import CI, load_record, read_record, to_json
from rakv.runtime.paths import ROOT

SHIPPED = ROOT / "data" / "reference" / "peer"
DOC = ROOT / "docs" / "peers.md"


def run(throughput: float, ttft: float) -> ClientRun:
    metrics = {m.field: 100.0 for m in SERVE_METRICS}
    return ClientRun(**metrics | {"output_throughput": throughput, "p99_ttft_ms": ttft, "prefix_hit_rate": None,
                                  "completed": 4, "failed": 0})


def test_the_serve_statistics_are_t_intervals_over_repeats_and_paired_log_ratios():
    ours, theirs = [(30.0, 100.0), (33.0, 120.0), (36.0, 90.0)], [(15.0, 200.0), (15.0, 200.0), (20.0, 300.0)]
    repeats = [RepeatRecord({"rakv": {"plain-1": run(*a)}, "vllm": {"plain-1": run(*b)}}, {})
               for a, b in zip(ours, theirs)]
    aggregate = pt.serve_aggregates(repeats)["rakv"]["plain-1"]
    half = stats.t.ppf(0.975, 2) * stats.tstd([30.0, 33.0, 36.0]) / math.sqrt(3)
    assert aggregate.output_throughput == pytest.approx((33.0, 33.0 - half, 33.0 + half))
    assert aggregate.completed == 12 and aggregate.repeats == 3
    assert aggregate.prefix_hit_rate == CI(None, None, None)  # no value, no made-up interval
    ratio = pt.serve_paired(repeats)["vllm"]["plain-1"].output_throughput
    logs = [math.log(a / b) for (a, _), (b, _) in zip(ours, theirs)]
    assert ratio[0] == pytest.approx(math.exp(sum(logs) / 3))
    assert ratio[1] < ratio[0] < ratio[2]
    assert "rakv" not in pt.serve_paired(repeats)


def test_the_tune_check_is_read_against_its_own_noise():
    """Where the tuned schedule runs the k of a fixed column, the gap between the two is noise; against k = 0 a
    difference inside it is 'within', outside it 'above' or 'below' (both signs reachable)."""
    tune = {"vllm": "0.32.0", "alpha": 0.4, "match_rate": 0.6, "steps": [], "hand": [],
            "model": {"fixed_s": 0.03, "per_request_s": 0.0, "per_row_s": 0.001},
            "schedule": [[1, 6, 2], [7, 12, 0], [13, 1024, 2]],
            "check": [{"config": c, "c": n, "tok_s": t, "tpot_s": None} for c, n, t in
                      [("tuned", 1, 19.0), ("k=0", 1, 15.0), ("k=2", 1, 18.0),
                       ("tuned", 8, 68.0), ("k=0", 8, 62.0), ("k=2", 8, 54.0),
                       ("tuned", 16, 70.0), ("k=0", 16, 85.0), ("k=2", 16, 69.0)]]}
    reading = pt.tune_reading(load_record(TuneReport, tune, "tune.json"))
    assert reading.noise == pytest.approx(68.0 / 62.0 - 1)  # the largest gap: c = 8, both k = 0
    sides = {a.c: a.side for a in reading.against_k0}
    assert sides == {1: "above", 8: "within", 16: "below"}
    assert "within that noise" in pt.tune_sentence(reading)


def test_a_document_block_without_data_is_an_error_not_left_stale():
    text = "a\n<!-- peer-table: missing -->\nold\n<!-- /peer-table: missing -->\n"
    with pytest.raises(ValueError, match="missing"):
        pt.refresh(text, {})
    assert pt.refresh(text, {"missing": "new\n"}) == text.replace("old\n", "new\n")


def test_docs_peers_tables_are_the_shipped_data():
    text = DOC.read_text()
    blocks = pt.doc_blocks(text)
    assert {"bench_vllm_serve", "bench_vllm_serve-ratios", "bench_serving", "tune_vllm"} <= set(blocks)
    assert pt.refresh(text, pt.render_blocks(SHIPPED)) == text, "run scripts/peer_tables.py"


def test_docs_peers_prose_quotes_no_measured_number_of_its_own():
    """Every measured number in docs/peers.md sits in a block rendered from the shipped files: the prose around them
    names settings (versions, counts, commands, the 95 % level), never a result (a decimal or a percentage)."""
    text = pt.BLOCK.sub("", DOC.read_text())
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    text = text.replace("95 %", "")  # the confidence level, a setting
    measured = re.findall(r"(?<![\w.])\d+\.\d+(?![\w.])(?! ?GB)|\d+(?:\.\d+)? ?%", text)
    assert not measured, f"numbers in docs/peers.md's prose that no shipped file renders: {measured}"


SHIPPED_REPORTS = [("bench_vllm_serve/summary.json", VllmServeSummary), ("tune_vllm/tune.json", TuneReport)] + [
    (f"bench_serving/{p.name}", ServingBenchReport) for p in sorted((SHIPPED / "bench_serving").glob("*.json"))]


@pytest.mark.parametrize("name, record", SHIPPED_REPORTS, ids=[name for name, _ in SHIPPED_REPORTS])
def test_every_shipped_bench_report_reads_back_through_its_record_and_is_rewritten_the_same(name, record):
    text = (SHIPPED / name).read_text()
    report = read_record(record, SHIPPED / name)
    assert json.dumps(to_json(report), indent=1) == text  # the same keys, order and numbers: the same bytes


def test_a_shipped_report_of_another_shape_stops_with_one_line_naming_the_field(tmp_path):
    data = json.loads((SHIPPED / "bench_serving" / "ar.json").read_text())
    del data["rows"][1]["ours_tok_s"]
    (tmp_path / "ar.json").write_text(json.dumps(data))
    with pytest.raises(RakvError, match=r"ar.json: missing field 'rows\[1\].ours_tok_s'"):
        read_record(ServingBenchReport, tmp_path / "ar.json")
    data = json.loads((SHIPPED / "tune_vllm" / "tune.json").read_text()) | {"tuned_by": "hand"}
    with pytest.raises(RakvError, match="unknown field 'tuned_by'"):
        load_record(TuneReport, data, "tune.json")
