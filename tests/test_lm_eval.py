"""lm-evaluation-harness against rakv serve --http: the exact request shapes its `local-completions` model sends
(log-likelihood: token-id prompts in a batch, echo, logprobs=1, one token or none generated; generation: `until`
stops) answered as its parsers read them, against a direct computation with the model, without lm-eval installed;
then, when scripts/setup_lm_eval.sh has made .venv-lm-eval, lm-eval itself on a small slice of the two tasks of
conf/lm_eval/ through the server and through its HF backend on the same weights. The tasks' shipped data is what
scripts/lm_eval_tasks.py writes."""

import json
import subprocess
from operator import itemgetter
from pathlib import Path

import pytest
import torch
from test_http import Served, alone

ROOT = Path(__file__).resolve().parents[1]
LM_EVAL = ROOT / ".venv-lm-eval" / "bin" / "lm_eval"
CONTEXT = "The quick brown fox jumps over the lazy dog. The dog"
CONTINUATIONS = [" sleeps.", " barks at the fox.", " is brown."]


@pytest.fixture(scope="module")
def served(tiny_pair, tmp_path_factory):
    server = Served(tiny_pair, tmp_path_factory.mktemp("lm_eval"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stock_tiny():
    from rakv.runtime.models import load_pair

    return load_pair("tiny", kernels="stock")


def parse_logprobs(out: dict, ctxlens: list[int]) -> list[tuple[float, bool]]:
    """lm-eval 0.4.13's LocalCompletionsAPI.parse_logprobs, as it reads an answer."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=itemgetter("index")), ctxlens):
        tokens_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(tok == max(top.values()) for tok, top in zip(tokens_logprobs, top_logprobs))
        res.append((sum(tokens_logprobs), greedy))
    return res


def direct(pair, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """The continuation's log-likelihood given the context, and whether it is the greedy one: one transformers
    forward of the same weights (fp32 log-softmax), as lm-eval's HF backend computes it."""
    ids = context + continuation
    with torch.inference_mode():
        logprobs = torch.log_softmax(pair.target.module(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    rows = logprobs[len(context) - 1:len(ids) - 1]
    target = torch.tensor(continuation)
    return float(rows.gather(1, target.unsqueeze(1)).sum()), bool((rows.argmax(-1) == target).all())


def test_lm_eval_s_log_likelihood_requests_are_answered_as_the_model_computes_them(served, stock_tiny):
    tokenizer = stock_tiny.tokenizer
    context = tokenizer(CONTEXT, add_special_tokens=False)["input_ids"]
    continuations = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in CONTINUATIONS]
    greedy = alone(served.engine, CONTEXT, 3)  # a continuation the model picks: is_greedy must say so
    continuations.append(greedy)
    prompts = [context + c for c in continuations]
    expected = [direct(stock_tiny, context, c) for c in continuations]
    assert expected[-1][1] and not all(g for _, g in expected)  # (both answers of is_greedy occur)
    for max_tokens in (1, 0):  # lm-eval 0.4.13 sends 1 (its parser drops the last position); vLLM's own users 0
        payload = {"model": "tiny", "prompt": prompts, "temperature": 0, "max_tokens": max_tokens, "logprobs": 1,
                   "seed": 1234, "echo": True}
        answer = served.post(payload)
        assert answer.status_code == 200, answer.text
        out = answer.json()
        if max_tokens == 0:  # nothing generated: the whole continuation is the last positions
            for choice in out["choices"]:
                choice["logprobs"]["token_logprobs"].append(None)
                choice["logprobs"]["top_logprobs"].append(None)
        got = parse_logprobs(out, [len(context)] * len(prompts))
        for (value, is_greedy), (want, want_greedy) in zip(got, expected):
            assert abs(value - want) < 1e-3 and is_greedy == want_greedy, (max_tokens, value, want)
    # positive control: the same parser on another context's answer gives other numbers
    shifted = parse_logprobs(served.post({**payload, "prompt": [p[1:] for p in prompts]}).json(),
                             [len(context) - 1] * len(prompts))
    assert max(abs(a - b) for (a, _), (b, _) in zip(shifted, expected)) > 1e-3


def test_lm_eval_s_generation_requests_stop_at_until_as_batch_one_ar(served):
    engine = served.engine
    prompts = ["def fibonacci(n):\n", "import os\n\n\ndef main():\n"]
    ids = [engine.encode(p) for p in prompts]
    full = [engine.pair.tokenizer.decode(alone(engine, p, 24), skip_special_tokens=True) for p in prompts]
    until = ["\n\n", full[0][5:8], "<|endoftext|>"]
    payload = {"prompt": ids, "model": "tiny", "max_tokens": 24, "temperature": 0, "stop": until, "seed": 1234}
    out = served.post(payload).json()
    texts = [None] * len(out["choices"])  # lm-eval's parse_generations
    for choice in out["choices"]:
        texts[choice["index"]] = choice["text"]
    for text, reference in zip(texts, full):
        for stop in until:
            reference = reference.split(stop)[0]
        assert text == reference
    assert texts[0] == full[0][:5] and out["choices"][0]["finish_reason"] == "stop"  # (the stop was met)


def test_the_shipped_task_data_is_what_the_builder_writes(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("lm_eval_tasks", ROOT / "scripts" / "lm_eval_tasks.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    builder.write(tmp_path)
    for name in ("humaneval_gen.jsonl", "wikitext_mc.jsonl"):
        assert (tmp_path / name).read_text() == (ROOT / "data" / "lm_eval" / name).read_text(), name
    docs = [json.loads(line) for line in (ROOT / "data" / "lm_eval" / "wikitext_mc.jsonl").read_text().splitlines()]
    assert all(len(d["choices"]) == 4 and 0 <= d["gold"] < 4 for d in docs)


def run_lm_eval(args: list[str], out: Path) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(out)}
    done = subprocess.run([str(LM_EVAL), *args, "--include_path", "conf/lm_eval", "--limit", "2",
                           "--tasks", "rakv_wikitext_mc,rakv_humaneval_gen", "--output_path", str(out),
                           "--log_samples"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def samples(folder: Path, task: str) -> list[dict]:
    path = sorted(folder.rglob(f"samples_{task}_*.jsonl"))[-1]
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=itemgetter("doc_id"))


@pytest.mark.skipif(not LM_EVAL.exists(), reason="lm-eval is not installed: run scripts/setup_lm_eval.sh "
                                                  "(its own venv, .venv-lm-eval)")
def test_lm_eval_itself_on_a_slice_equals_its_hf_backend_and_batch_one_ar(served, stock_tiny, tmp_path):
    """The tiny pair (fast): its weights and tokenizer saved as a transformers folder for the HF backend."""
    folder = tmp_path / "tiny"
    stock_tiny.target.module.save_pretrained(folder)
    stock_tiny.tokenizer.save_pretrained(folder)
    run_lm_eval(["--model", "local-completions", "--batch_size", "2", "--model_args",
                 f"model=tiny,base_url={served.url}/v1/completions,tokenizer_backend=huggingface,"
                 f"tokenizer={folder},num_concurrent=1,max_retries=1"], tmp_path / "served")
    run_lm_eval(["--model", "hf", "--model_args", f"pretrained={folder},dtype=float32", "--device", "cpu",
                 "--batch_size", "1"], tmp_path / "hf")
    for a, b in zip(samples(tmp_path / "served", "rakv_wikitext_mc"), samples(tmp_path / "hf", "rakv_wikitext_mc")):
        assert a["doc_id"] == b["doc_id"]
        for x, y in zip(a["resps"], b["resps"]):
            assert abs(float(x[0][0]) - float(y[0][0])) < 1e-3
    for sample in samples(tmp_path / "served", "rakv_humaneval_gen"):
        request = sample["arguments"]["gen_args_0"]
        reference = served.engine.pair.tokenizer.decode(
            alone(served.engine, request["arg_0"], request["arg_1"]["max_gen_toks"]), skip_special_tokens=True)
        for stop in request["arg_1"]["until"]:
            reference = reference.split(stop)[0]
        assert sample["resps"][0][0] == reference


def test_the_shipped_lm_eval_run_meets_its_goals():
    """data/lm_eval/run/comparison.json (scripts/run_lm_eval.sh with SHIP): a typed record whose log-likelihoods are
    within the tolerance and whose generations all equal batch-one AR's."""
    import dataclasses
    import importlib.util

    from rakv.runtime.json_records import read_record

    spec = importlib.util.spec_from_file_location("compare_lm_eval", ROOT / "scripts" / "compare_lm_eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shipped = read_record(module.LmEvalComparison, ROOT / "data" / "lm_eval" / "run" / "comparison.json")

    def meets(run) -> bool:
        return (run.loglikelihoods > 0 and run.max_abs_loglikelihood_diff <= run.atol <= 1e-3
                and run.generations > 0 and run.generations_equal_ar == run.generations)

    assert meets(shipped) and shipped.served_metrics == pytest.approx(shipped.hf_metrics)
    assert not meets(dataclasses.replace(shipped, generations_equal_ar=shipped.generations - 1))  # positive control
    assert not meets(dataclasses.replace(shipped, max_abs_loglikelihood_diff=2e-3))
