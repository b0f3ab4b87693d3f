"""The summary's schema (rakv.experiments.summary): summary.json is read and written through it, an old or edited
file stops with one line naming the field (no string-key read of it anywhere: tests/test_records.py)."""

import json
import re
from dataclasses import fields, is_dataclass
from typing import get_type_hints

import pytest

from rakv.experiments import summary as schema
from rakv.experiments import summary_sampling, summary_serving
from rakv.experiments.summary import Feasibility, Summary, read_summary, write_summary
from rakv.experiments.verdicts import Verdict
from rakv.runtime.errors import RakvError
from rakv.runtime.json_records import ABSENT, CI, load_record, to_json
from rakv.runtime.paths import REFERENCE_DIR
from rakv.runtime.run_layout import RunLayout

REFERENCE = REFERENCE_DIR / "offline"
SUMMARY = RunLayout.of(REFERENCE).summary


@pytest.fixture(scope="module")
def shipped() -> dict:
    return json.loads(SUMMARY.read_text())


def test_the_shipped_summary_reads_into_records_and_writes_back_byte_for_byte(shipped, tmp_path):
    summary = read_summary(REFERENCE)
    assert summary.per_configuration["smollm2"].latency_reduction.joint_k4 == \
        CI(*shipped["per_configuration"]["smollm2"]["latency_reduction"]["joint-k4"])
    assert summary.serving.goals[0].verdict == shipped["serving"]["goals"][0]["verdict"]
    written = write_summary(summary, tmp_path)
    assert written == RunLayout.of(tmp_path).summary and written.read_text() == SUMMARY.read_text()


def failure(data) -> str:
    with pytest.raises(RakvError) as caught:
        Summary.from_json(data)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_old_or_edited_summary_fails_with_one_line_naming_the_field(shipped):
    old = json.loads(json.dumps(shipped))
    del old["claims"][3]["direction"]
    assert failure(old) == "summary.json: missing field 'claims[3].direction'"
    mistyped = json.loads(json.dumps(shipped))
    mistyped["per_configuration"]["smollm2"]["scenarios"] = "forty"
    assert failure(mistyped).startswith("summary.json: field 'per_configuration.smollm2.scenarios' is not a int")
    bad_interval = json.loads(json.dumps(shipped))
    bad_interval["pooled"]["latency_reduction"]["kv-only"] = [0.1, 0.2]
    assert failure(bad_interval) == \
        "summary.json: field 'pooled.latency_reduction.kv-only' is not an interval [value, low, high]"
    unknown = json.loads(json.dumps(shipped))
    unknown["grid"]["promtps"] = {}
    assert failure(unknown) == "summary.json: unknown field 'grid.promtps'"
    missing_part = {k: v for k, v in shipped.items() if k != "claims"}
    assert failure(missing_part) == "summary.json: missing field 'claims'"
    unknown_word = json.loads(json.dumps(shipped))
    unknown_word["serving"]["goals"][0]["verdict"] = "passed"
    assert failure(unknown_word).startswith("summary.json: field 'serving.goals[0].verdict' is not one of met, missed")


def test_a_goals_verdict_reads_back_as_the_one_vocabulary(shipped):
    """Goal and pair verdicts read back as rakv.experiments.verdicts.Verdict members, equal to the words written."""
    serving = read_summary(REFERENCE).serving
    assert all(isinstance(g.verdict, Verdict) for g in serving.goals + serving.pairs)
    assert [g.verdict for g in serving.goals] == [g["verdict"] for g in shipped["serving"]["goals"]]


def test_a_part_that_was_not_computed_is_left_out_not_written_as_null(shipped):
    without = {k: v for k, v in shipped.items() if k not in ("serving", "crossover_model_per_configuration")}
    summary = Summary.from_json(without)
    assert summary.serving is ABSENT and not summary.serving
    assert summary.to_json() == without
    assert to_json(load_record(Feasibility, {"status": "missing"}, "feasibility")) == {"status": "missing"}


def test_a_missing_summary_names_the_stage_to_run(tmp_path):
    with pytest.raises(RakvError, match="summary.json is missing: run the analysis stage first"):
        read_summary(tmp_path)


def test_the_records_have_no_mapping_methods():
    """A string-key read of a record fails at once (TypeError), wherever it hides from the static check below."""
    records = [v for module in (schema, summary_serving, summary_sampling) for v in vars(module).values()
               if isinstance(v, type) and is_dataclass(v)]
    assert len(records) > 40
    for record in records:
        for method in ("__getitem__", "get", "keys", "items"):
            assert not hasattr(record, method), f"{record.__name__}.{method}"


def test_every_field_of_the_summary_has_a_type_the_loader_checks():
    def walk(record):
        for f in fields(record):
            hint = get_type_hints(record)[f.name]
            for inner in re.findall(r"\w+", str(hint)):
                candidate = getattr(schema, inner, None)
                if isinstance(candidate, type) and is_dataclass(candidate) and candidate is not record:
                    yield from walk(candidate)
            yield record.__name__, f.name, hint
    assert len(list(walk(Summary))) > 100
