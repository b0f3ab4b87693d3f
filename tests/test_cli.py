"""`rakv generate` end to end on the tiny pair, and every bad input: one line, non-zero, no traceback."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rakv.cli import main
from rakv.runtime.errors import RakvError, WeightsUnavailable
from rakv.runtime.models import Fingerprint, LoadedModel, check_shared_tokenizer

PROMPT = "The quick brown fox jumps over the lazy dog and then runs far away into the dark forest"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def generate(capsys, *extra):
    return run_cli(capsys, "generate", "--pair", "tiny", "--max-new-tokens", "6", "--threads", "2", *extra)


def test_json_output_and_store_shared_across_prompts(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "prompt": PROMPT}, {"id": "b", "prompt": PROMPT},
        {"id": "c", "prompt": PROMPT, "salt": "other-tenant"}, {"id": "d", "prompt": PROMPT + " again and again"}]))
    code, out, err = generate(capsys, "--prompts", str(prompts), "--strategy", "joint-k4", "--json", "--ignore-eos")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    for key in ("id", "prompt_tokens", "hit_tokens", "new_tokens", "token_ids", "text", "reuse", "k", "proposed",
                "accepted", "ttft_s", "latency_s", "tokens_per_s"):
        assert all(key in row for row in rows), key
    hits = {row["id"]: row["hit_tokens"] for row in rows}
    assert hits["a"] == 0 and hits["b"] == rows[1]["prompt_tokens"] and hits["c"] == 0
    assert hits["d"] == rows[0]["prompt_tokens"] - 1
    assert len({tuple(row["token_ids"]) for row in rows[:3]}) == 1 and all(r["new_tokens"] == 6 for r in rows)


def test_readable_output(capsys):
    code, out, err = generate(capsys, "--prompt", PROMPT, "--strategy", "spec-k2")
    assert code == 0 and "prompt tokens" in out and "k=2" in out


@pytest.mark.parametrize("argv, message", [
    (["--prompt", "   ", "--strategy", "ar"], "empty prompt"),
    (["--prompt", "x " * 1100, "--strategy", "ar"], "exceeds the model context"),
    (["--prompt", PROMPT, "--strategy", "ar", "--max-new-tokens", "0"], "must be positive"),
    (["--prompt", PROMPT, "--strategy", "spec-k3"], "unknown strategy"),
    (["--prompt", PROMPT, "--strategy", "ar", "--pair", "gpt5"], "unknown pair"),
    (["--prompts", "/nonexistent/p.jsonl", "--strategy", "ar"], "cannot read prompts file"),
])
def test_bad_input_is_one_line_error(capsys, argv, message):
    base = ["generate", "--pair", "tiny", "--max-new-tokens", "6"]
    code, out, err = run_cli(capsys, *base, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("content, message", [
    ('{"id": 1, "prompt": "fine"}\n{"id": 2, "prompt": \n', ":2: not valid JSON"),
    ('{"id": 1, "text": "no prompt key"}\n', ":1: expected an object"),
    ('{"id": 1, "prompt": ""}\n', ":1: empty prompt"),
    ('{"id": 1, "prompt": "ok", "salt": 5}\n', "salt"),
    ("\n\n", "no prompts"),
])
def test_malformed_jsonl_stops_before_any_work(capsys, tmp_path, content, message, monkeypatch):
    import rakv.runtime.models

    monkeypatch.setattr(rakv.runtime.models, "load_pair",
                        lambda *a, **k: pytest.fail("models loaded before validation"))
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    code, out, err = generate(capsys, "--prompts", str(path), "--strategy", "ar")
    assert code == 2 and message in err and out == ""


def test_too_long_prompt_in_file_stops_before_generation(capsys, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": "ok", "prompt": PROMPT}) + "\n"
                    + json.dumps({"id": "long", "prompt": "y " * 1100}))
    code, out, err = generate(capsys, "--prompts", str(path), "--strategy", "ar", "--json")
    assert code == 2 and "request long" in err and out == ""


def test_mismatched_tokenizers_refused():
    def fp(tok):
        return Fingerprint("m", "w", "float32", "none", tok)

    with pytest.raises(RakvError, match="tokenizers differ"):
        check_shared_tokenizer("p", LoadedModel(None, fp("aaaa"), 1024), LoadedModel(None, fp("bbbb"), 1024))


def test_unreachable_hub_model_is_a_clear_error(monkeypatch, tmp_path):
    from rakv.runtime.models import load_pair

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    with pytest.raises(WeightsUnavailable, match="neither in the local Hugging Face cache"):
        load_pair("gpt2-distilgpt2")


def test_an_unreachable_hub_is_asked_once_then_the_local_cache_only(monkeypatch, tmp_path):
    """Without HF_HUB_OFFLINE, an unreachable hub is found by one connection attempt, and the loaders then read the
    local cache only (no per-file retries with back-off); a reachable one (or a proxy) leaves them as they are."""
    import socket

    import transformers

    from rakv.runtime import models

    for name in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    attempts, asked = [], []

    def refused(address, timeout):
        attempts.append(address)
        raise OSError("Name or service not known")

    def from_pretrained(model_id, **kwargs):
        asked.append(kwargs.get("local_files_only"))
        raise OSError("not cached")

    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    models.hub_reachable.cache_clear()
    try:
        with pytest.raises(WeightsUnavailable, match="neither in the local Hugging Face cache"):
            models._hub_model("gpt2", "cpu", torch.float32)
        assert attempts == [("huggingface.co", 443)] and asked == [True]
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
        models.hub_reachable.cache_clear()
        with pytest.raises(WeightsUnavailable):
            models._hub_model("gpt2", "cpu", torch.float32)
        assert len(attempts) == 1 and asked == [True, False]
    finally:
        models.hub_reachable.cache_clear()


def test_console_script_error_has_no_traceback():
    exe = Path(sys.executable).parent / "rakv"
    proc = subprocess.run([str(exe), "generate", "--pair", "tiny", "--prompt", "hi", "--max-new-tokens", "-3",
                           "--strategy", "ar"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("rakv: error:") and "Traceback" not in proc.stderr


def test_option_flags_are_generated_from_the_fields_that_declare_them(capsys, monkeypatch):
    """Each option is declared once, as a dataclass field: its flag, help and default (conf/'s) come from there."""
    from dataclasses import fields

    from rakv.cli import build_parser
    from rakv.runtime.controller import ControllerConfig
    from rakv.runtime.engine_options import EngineOptions
    from rakv.runtime.paths import conf_file
    from rakv.serving.server import CONF_FIELDS, ServeOptions

    args = build_parser().parse_args(["serve", "--pair", "tiny", "--trace", "t.jsonl"])
    serving, store = conf_file("serving/default.yaml"), conf_file("cache/default.yaml")
    assert all(getattr(args, name) == serving[name] for name in CONF_FIELDS)
    assert args.proposer == serving.proposer and args.cache_budget_mib == store.budget_mib
    assert args.reuse_draft == store.reuse_draft
    assert args.memory_budget_mib == ControllerConfig.default().memory_budget_mib
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping inside a help text
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for cls in (ServeOptions, EngineOptions):
        for spec in fields(cls):
            if "help" in spec.metadata:
                assert " ".join(spec.metadata["help"].split()) in shown, spec.name
    assert "--no-chunking" in shown and "--goodput METRIC:MS" in shown and "(default 256)" in shown


def test_a_switch_named_no_always_clears_its_field_whatever_the_default():
    import argparse
    from dataclasses import dataclass, field

    from rakv.runtime.flags import add_flags

    @dataclass
    class Switches:
        reuse: bool = field(metadata={"flag": "--no-reuse", "help": "off"})
        fast: bool = field(metadata={"help": "on"})

    for reuse_default in (True, False):
        parser = argparse.ArgumentParser()
        add_flags(parser, Switches, ("reuse", "fast"), {"reuse": reuse_default, "fast": False})
        assert parser.parse_args([]).reuse is reuse_default
        assert parser.parse_args(["--no-reuse"]).reuse is False
        assert parser.parse_args(["--fast"]).fast is True
    parser = argparse.ArgumentParser()
    add_flags(parser, Switches, ("fast",), {"fast": True})
    assert parser.parse_args(["--no-fast"]).fast is False


def test_the_process_age_a_server_reports_when_ready_counts_from_the_process_start():
    import time

    from rakv.cli import process_age_s

    age = process_age_s()
    assert age is not None and age > 0  # this process has run the test session's imports and collection by now
    time.sleep(0.3)
    assert process_age_s() - age == pytest.approx(0.3, abs=0.1)  # /proc's clock ticks at 100 Hz


def test_trace_settings_are_declared_once_with_conf_as_their_defaults(tmp_path):
    """`rakv trace`'s flags are TraceOptions' fields; their defaults, generate_trace's for a keyword left out and the
    serving study's base are all conf/serving/default.yaml's `trace:` (groups 4, the CLI's default before too)."""
    from dataclasses import asdict

    from rakv.cli import build_parser
    from rakv.runtime.paths import conf_file
    from rakv.serving.trace import TRACE_FLAGS, TraceOptions, generate_trace

    conf = dict(conf_file("serving/default.yaml").trace)
    assert TRACE_FLAGS == tuple(conf) and asdict(TraceOptions.default()) == conf
    args = build_parser().parse_args(["trace", "--out", str(tmp_path / "t.jsonl")])
    assert {name: getattr(args, name) for name in TRACE_FLAGS} == conf
    texts = [(str(i), f"word{i} " * 40) for i in range(12)]
    assert generate_trace(texts, requests=8, rate=4.0, kind="shared-prefix") == generate_trace(
        texts, requests=8, rate=4.0, kind="shared-prefix", groups=conf["groups"])
    with pytest.raises(RakvError, match="unknown trace setting"):
        generate_trace(texts, requests=8, rate=4.0, group=2)


def test_proposer_names_and_open_engine_defaults_are_declared_once():
    """The proposers' names: rakv.runtime.proposers.PROPOSERS only (the engine's flag offers the registry itself);
    open_engine's defaults: conf/'s, read through the one mapping EngineOptions uses too."""
    import inspect
    from dataclasses import fields

    from rakv.runtime import engine
    from rakv.runtime.engine_options import EngineOptions
    from rakv.runtime.paths import conf_file
    from rakv.runtime.proposers import PROPOSERS

    assert not hasattr(engine, "PROPOSERS")
    assert next(f for f in fields(EngineOptions) if f.name == "proposer").metadata["choices"] is PROPOSERS
    pipeline, store = conf_file("config.yaml"), conf_file("cache/default.yaml")
    assert engine.conf_engine_options() == EngineOptions.conf_defaults() == {
        "device": pipeline.device, "dtype": pipeline.dtype, "kernels": pipeline.kernels, "threads": pipeline.threads,
        "salt": store.salt, "cache_budget_mib": store.budget_mib, "reuse_draft": store.reuse_draft}
    defaults = [p for p in inspect.signature(engine.open_engine).parameters.values()
                if p.default is not inspect.Parameter.empty]
    assert not defaults  # none of its own: conf's
    opened = engine.open_engine("tiny", "prompt-lookup", cache_budget_mib=1)
    assert opened.store.budget_bytes == 1 << 20 and opened.reuse_draft is store.reuse_draft
