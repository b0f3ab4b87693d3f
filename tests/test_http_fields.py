"""The request fields evaluation tools send to rakv serve --http: `stop` (cut where the stop begins, streaming or not,
in speculation's accepted runs too), a list of prompts and `n` choices (indexed as OpenAI's, seeded as vLLM's),
`echo` and `logprobs` (the target's own log-probabilities, against a direct forward), each through the official
`openai` client, and each bad value a one-line 400 while the server serves on."""

import math
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_http import PROMPT, Served, alone

from rakv.runtime.decoding import DecodeState
from rakv.serving.stops import StopState, first_stop, output_text, visible

# --- the stop check alone, on a fake tokenizer whose tokens are multi-character pieces ---

PIECES = ["a", "b", "ab", "ba", "abc", "c", "\n", "cab", "bb", " "]


def decode(tokens):
    return "".join(PIECES[t] for t in tokens)


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.integers(0, len(PIECES) - 1), min_size=1, max_size=30),
       stops=st.lists(st.text("abc\n ", min_size=1, max_size=4), min_size=1, max_size=3),
       runs=st.lists(st.integers(1, 5), min_size=30, max_size=30))
def test_a_stop_ends_the_output_at_its_first_token_whatever_the_runs_tokens_arrive_in(tokens, stops, runs):
    """Tokens confirmed in runs (a speculative round accepts several at once): the output ends at the first token
    whose text holds a stop (split across tokens, inside one, any of several), the text cut where it begins; what
    a stream shows is always a prefix of the answer."""
    state = StopState(len(tokens), None, True, stops=tuple(stops), decode=decode)
    shown, offered = "", 0
    for run in runs:
        if state.finished or offered >= len(tokens):
            break
        new = tokens[offered:offered + run]
        state.emit(new)
        offered += len(new)
        now = visible(state, decode(state.tokens), state.finished)
        assert now.startswith(shown)
        shown = now
    full = decode(tokens)
    expected_tokens = next((i for i in range(1, len(tokens) + 1) if first_stop(decode(tokens[:i]), stops)),
                           len(tokens))
    assert state.tokens == tokens[:expected_tokens]
    answer = output_text(state, decode(state.tokens))
    hit = first_stop(full, tuple(stops))
    assert answer == (full[:hit[0]] if hit else full) == visible(state, decode(state.tokens), True)
    assert (state.stop_reason is not None) == (hit is not None)
    assert not any(s in answer for s in stops)
    # positive control: the plain state confirms past the stop, so a missing cut would fail the checks above
    plain = DecodeState(len(tokens), None, True)
    plain.emit(tokens)
    assert hit is None or any(s in decode(plain.tokens) for s in stops)


def test_the_stop_check_cuts_inside_one_token_and_between_two():
    inside = StopState(10, None, True, stops=("b",), decode=decode)
    inside.emit([4, 0, 0])  # "abc": the stop is inside the first token; nothing after it is confirmed
    assert inside.tokens == [4] and output_text(inside, decode(inside.tokens)) == "a" and inside.finished
    split = StopState(10, None, True, stops=("ab",), decode=decode)
    split.emit([0])  # "a": could begin the stop: held back from a stream
    assert not split.finished and visible(split, "a", False) == ""
    split.emit([1, 5])  # "a" + "b": the stop spans two tokens
    assert split.tokens == [0, 1] and output_text(split, decode(split.tokens)) == ""
    assert split.stop_reason == "ab" and split.confirmable([0]) == 0


# --- over HTTP, the tiny pair (strategy joint-k2: speculation's accepted runs) ---

@pytest.fixture(scope="module")
def served(tiny_pair, tmp_path_factory):
    server = Served(tiny_pair, tmp_path_factory.mktemp("fields"))
    yield server
    server.stop()


def test_stop_strings_cut_completions_and_chat_streamed_or_not(served):
    engine, client = served.engine, served.openai
    full = engine.pair.tokenizer.decode(alone(engine, PROMPT, 24), skip_special_tokens=True)
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip() and full.find(stop) > 0
    expected = full[:full.find(stop)]
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=24, extra_body={"ignore_eos": True})
    whole = client.completions.create(stop=[stop, "\x00never"], **kw)
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens < 24
    streamed = list(client.completions.create(stop=stop, stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected
    assert [c.choices[0].finish_reason for c in streamed if c.choices][-1] == "stop"
    unstopped = client.completions.create(stop="\x00never", **kw)  # positive control: no stop, the whole text
    assert unstopped.choices[0].text == full and unstopped.choices[0].finish_reason == "length"
    messages = [{"role": "user", "content": "Name a prime."}]
    chat_full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16,
                                               extra_body={"ignore_eos": True}).choices[0].message.content
    chat_stop = chat_full[len(chat_full) // 2:len(chat_full) // 2 + 2]
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, stop=[chat_stop],
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == chat_full[:chat_full.find(chat_stop)]
    assert chat.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, stop=[chat_stop],
                                            stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content


def test_a_list_of_prompts_and_n_choices_are_indexed_and_seeded_as_openai_and_vllm(served):
    engine, client = served.engine, served.openai
    prompts = [PROMPT, "x = [1, 2, 3]\n"]
    greedy = client.completions.create(model="tiny", prompt=prompts, max_tokens=6, extra_body={"ignore_eos": True})
    assert [c.index for c in greedy.choices] == [0, 1]
    for choice, prompt in zip(greedy.choices, prompts):  # each prompt's output is its own, alone
        assert choice.text == engine.pair.tokenizer.decode(alone(engine, prompt, 6), skip_special_tokens=True)
    prompt_tokens = sum(len(engine.pair.tokenizer.encode(p, add_special_tokens=False)) for p in prompts)
    assert greedy.usage.prompt_tokens == prompt_tokens and greedy.usage.completion_tokens == 12
    refused = served.post({"prompt": PROMPT, "n": 2, "temperature": 0})  # greedy n > 1: refused, as vLLM
    assert refused.status_code == 400 and "greedy" in refused.json()["error"]["message"]
    two = client.completions.create(model="tiny", prompt=prompts, n=2, temperature=1.0, seed=3, max_tokens=4)
    assert [c.index for c in two.choices] == [0, 1, 2, 3]  # choice j of prompt i: i * n + j
    assert two.choices[2].text == client.completions.create(model="tiny", prompt=prompts[1], temperature=1.0, seed=3,
                                                            max_tokens=4).choices[0].text
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True})
    sampled = client.completions.create(n=3, seed=11, **kw)
    alone_seeded = [client.completions.create(seed=11 + j, **kw).choices[0].text for j in range(3)]
    assert [c.text for c in sampled.choices] == alone_seeded  # choice j: the request's seed + j
    assert len(set(alone_seeded)) > 1  # (distinct seeds give distinct samples here: the check above can fail)
    messages = [{"role": "user", "content": "Name a prime."}]
    chat = dict(model="tiny", messages=messages, max_tokens=4, temperature=1.0)
    two_chats = client.chat.completions.create(n=2, seed=5, **chat)
    assert [c.index for c in two_chats.choices] == [0, 1]
    assert two_chats.choices[1].message.content == client.chat.completions.create(
        seed=6, **chat).choices[0].message.content
    streamed = list(client.completions.create(n=3, seed=11, stream=True, **kw))
    texts = ["", "", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == alone_seeded


@pytest.fixture(scope="module")
def stock_tiny():
    """The tiny pair's same weights under transformers' own forward (kernels=stock): the independent reference."""
    from rakv.runtime.models import load_pair

    return load_pair("tiny", kernels="stock")


def direct_logprobs(pair, ids):
    """log P(ids[i] | ids[:i]) from one plain transformers forward of the target module (fp32 log-softmax)."""
    with torch.inference_mode():
        logits = pair.target.module(input_ids=torch.tensor([ids])).logits[0].float()
    logprobs = torch.log_softmax(logits, -1)
    return [float(logprobs[i - 1, ids[i]]) for i in range(1, len(ids))], logprobs


def test_echo_and_logprobs_are_the_target_s_own_as_lm_eval_reads_them(served, stock_tiny):
    pair, client = stock_tiny, served.openai
    context = pair.tokenizer.encode(PROMPT, add_special_tokens=False)
    continuation = pair.tokenizer.encode(" return n", add_special_tokens=False)
    ids = context + continuation
    # lm-eval's local-completions log-likelihood request: token ids, echo, one token generated, logprobs=1
    answer = client.completions.create(model="tiny", prompt=[ids], echo=True, max_tokens=1, logprobs=1,
                                       temperature=0, seed=1234)
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(ids) + 1 and logprobs.token_logprobs[0] is None
    expected, table = direct_logprobs(pair, ids)
    got = logprobs.token_logprobs[1:len(ids)]
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-4
    for i in range(1, len(ids)):  # the top alternative is the argmax, the token's own is there too
        top = logprobs.top_logprobs[i]
        assert math.isclose(max(top.values()), float(table[i - 1].max()), abs_tol=1e-4) and len(top) <= 2
    assert answer.choices[0].text.startswith(pair.tokenizer.decode(ids))
    # positive control: a wrong continuation's sum differs (the comparison can fail)
    assert abs(sum(got) - sum(direct_logprobs(pair, context + continuation[::-1])[0])) > 1e-3
    scored = client.completions.create(model="tiny", prompt=PROMPT, echo=True, max_tokens=0, logprobs=3)
    assert scored.choices[0].text == PROMPT and scored.usage.completion_tokens == 0
    assert scored.choices[0].logprobs.token_logprobs[1:] == pytest.approx(
        direct_logprobs(pair, context)[0], abs=1e-4)
    generated = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=5, logprobs=2,
                                          extra_body={"ignore_eos": True})
    lp = generated.choices[0].logprobs
    assert len(lp.token_logprobs) == 5 and all(v <= 0 for v in lp.token_logprobs)
    assert "".join(lp.tokens) == generated.choices[0].text  # (byte-level pieces join into the text)


def test_chat_logprobs_are_the_target_s_own(served, stock_tiny):
    pair = stock_tiny
    messages = [{"role": "user", "content": "Name a prime."}]
    answer = served.openai.chat.completions.create(model="tiny", messages=messages, max_tokens=5, logprobs=True,
                                                   top_logprobs=2, extra_body={"ignore_eos": True})
    content = answer.choices[0].logprobs.content
    rendered = pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = pair.tokenizer.encode(rendered, add_special_tokens=False)
    output = alone(served.engine, rendered, 5)
    expected, table = direct_logprobs(pair, prompt + output)
    assert len(content) == 5 and [c.logprob for c in content] == pytest.approx(expected[len(prompt) - 1:], abs=1e-4)
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)
    assert "".join(c.token for c in content) == answer.choices[0].message.content
    plain = served.openai.chat.completions.create(model="tiny", messages=messages, max_tokens=5)
    assert plain.choices[0].logprobs is None  # (not asked: none)


def test_bad_values_of_the_new_fields_are_one_line_400s_while_the_server_serves_on(served):
    bad = [{"prompt": PROMPT, "stop": [""]}, {"prompt": PROMPT, "stop": ["a"] * 17}, {"prompt": PROMPT, "stop": 5},
           {"prompt": PROMPT, "stop": "x" * 300}, {"prompt": PROMPT, "n": 17}, {"prompt": PROMPT, "n": True},
           {"prompt": PROMPT, "logprobs": 21}, {"prompt": PROMPT, "logprobs": -1}, {"prompt": PROMPT, "echo": "yes"},
           {"prompt": PROMPT, "logprobs": 21, "stream": True}, {"prompt": PROMPT, "echo": 1, "stream": True},
           {"prompt": PROMPT, "echo": True, "logprobs": -1, "stream": True}, {"prompt": PROMPT, "max_tokens": 0},
           {"prompt": PROMPT, "max_tokens": 0, "stream": True},
           {"prompt": [[1], []]}, {"prompt": [PROMPT] * 65}, {"prompt": [[1, 2], "x"]},
           ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "/v1/chat/completions"),
           ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "stream": True},
            "/v1/chat/completions")]
    good = [{"prompt": [PROMPT, PROMPT + "1"], "max_tokens": 4, "stop": ["\n\n"], "n": 2, "temperature": 0.5}]
    results = {}

    def post(i, body):
        path = "/v1/completions"
        if isinstance(body, tuple):
            body, path = body
        results[i] = served.post(body, path)

    threads = [threading.Thread(target=post, args=(i, b)) for i, b in enumerate(good + bad)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results[0].status_code == 200 and len(results[0].json()["choices"]) == 4
    for i, body in enumerate(bad, 1):
        assert results[i].status_code == 400, (body, results[i].text)
        message = results[i].json()["error"]["message"]
        assert message and "\n" not in message, (body, message)
    assert served.http.get("/health").json()["status"] == "ok"


def joined(chunks) -> tuple[str, list, list, list, list]:
    """A completions stream put together: its text and its chunks' log-probabilities, one list per field."""
    text, tokens, values, tops, offsets = "", [], [], [], []
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                values += choice.logprobs.token_logprobs
                tops += choice.logprobs.top_logprobs
                offsets += choice.logprobs.text_offset
    return text, tokens, values, tops, offsets


def assert_same_logprobs(got: tuple, whole):
    text, tokens, values, tops, offsets = got
    lp = whole.choices[0].logprobs
    assert text == whole.choices[0].text and tokens == lp.tokens and offsets == lp.text_offset
    assert [v is None for v in values] == [v is None for v in lp.token_logprobs]
    assert [v for v in values if v is not None] == pytest.approx([v for v in lp.token_logprobs if v is not None],
                                                                 abs=1e-4)
    assert [None if t is None else sorted(t) for t in tops] == [None if t is None else sorted(t)
                                                                for t in lp.top_logprobs]


@pytest.mark.parametrize("with_stop", [False, True])
def test_streamed_echo_and_logprobs_put_together_are_the_whole_answer(served, with_stop):
    """As vLLM streams them: the prompt (and its log-probabilities) in the first chunk, each later chunk the
    log-probabilities of its own tokens; put together, the whole answer's (a stop string too: one the output holds,
    so that the stream holds text back and the output is cut)."""
    client = served.openai
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=8, logprobs=2, echo=True, temperature=0,
              extra_body={"ignore_eos": True})
    if with_stop:
        text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
        kw["stop"] = [text[len(text) // 2:len(text) // 2 + 2]]
    whole = client.completions.create(**kw)
    assert (whole.choices[0].finish_reason == "stop") == with_stop
    chunks = list(client.completions.create(stream=True, **kw))
    first = chunks[0].choices[0]
    assert first.text == PROMPT and first.logprobs.token_logprobs[0] is None
    assert len(first.logprobs.tokens) == len(served.engine.pair.tokenizer.encode(PROMPT, add_special_tokens=False))
    assert sum(1 for c in chunks if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.tokens) >= 3
    assert_same_logprobs(joined(chunks), whole)
    # positive control: a stream missing one chunk's log-probabilities is caught
    with pytest.raises(AssertionError):
        assert_same_logprobs(joined(chunks[1:]), whole)
    # without echo: the output alone, its offsets from 0
    del kw["echo"]
    assert_same_logprobs(joined(client.completions.create(stream=True, **kw)), client.completions.create(**kw))
    # neither: no log-probabilities in any chunk
    plain = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, stream=True))
    assert all(c.choices[0].logprobs is None for c in plain if c.choices)


def test_a_streamed_scoring_only_answer_is_one_chunk_per_choice(served):
    kw = dict(model="tiny", prompt=[PROMPT, PROMPT + "1"], echo=True, max_tokens=0, logprobs=1)
    whole = served.openai.completions.create(**kw)
    chunks = list(served.openai.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert [c.choices[0].text for c in chunks if c.choices] == [PROMPT, PROMPT + "1"]
    assert [c.choices[0].logprobs.tokens for c in chunks if c.choices] == [c.logprobs.tokens for c in whole.choices]
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens and chunks[-1].usage.completion_tokens == 0


# --- /tokenize, /detokenize, /version, --api-key, /metrics and the dashboard ---

def test_tokenize_detokenize_and_version_answer_as_vllm(served):
    tokenizer, http = served.engine.pair.tokenizer, served.http
    answer = http.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()
    expected = tokenizer.encode(PROMPT)  # vLLM adds special tokens to a prompt by default
    assert answer["tokens"] == expected and answer["count"] == len(expected)
    assert answer["token_strs"] == tokenizer.convert_ids_to_tokens(expected) and answer["max_model_len"] > 0
    assert http.post("/detokenize", json={"tokens": expected}).json()["prompt"] == tokenizer.decode(
        expected, skip_special_tokens=True)
    messages = [{"role": "user", "content": "Name a prime."}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat = http.post("/tokenize", json={"messages": messages}).json()
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    from importlib.metadata import version
    assert http.get("/version").json() == {"version": version("rakv")}
    for path, body in [("/tokenize", {}), ("/tokenize", {"prompt": "x", "messages": messages}),
                       ("/tokenize", {"prompt": 5}), ("/detokenize", {"tokens": [10 ** 9]}),
                       ("/detokenize", {"tokens": [-1]}), ("/tokenize", {"prompt": "x", "model": "other"})]:
        refused = http.post(path, json=body)
        assert refused.status_code in (400, 404) and "\n" not in refused.json()["error"]["message"], (path, body)


def test_an_api_key_guards_the_v1_routes_and_leaves_health_and_metrics_open(tiny_pair, tmp_path, monkeypatch):
    import openai

    from rakv.runtime.errors import RakvError
    from rakv.serving.http_options import HttpOptions

    server = Served(tiny_pair, tmp_path, api_key="sekrit")
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            refused = server.http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "AuthenticationError"
            assert server.http.get("/v1/models", headers=headers).status_code == 401
        keyed = openai.OpenAI(base_url=server.url + "/v1", api_key="sekrit", max_retries=0)
        assert keyed.completions.create(model="tiny", prompt=PROMPT, max_tokens=2).choices[0].text is not None
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
        for path in ("/health", "/metrics", "/version"):  # open, as vLLM's
            assert server.http.get(path).status_code == 200
    finally:
        server.stop()
    unkeyed = HttpOptions.default()
    assert unkeyed.api_key is None
    monkeypatch.setenv("RAKV_API_KEY", "from-env")
    assert unkeyed.key == "from-env" and HttpOptions.default(api_key="flag").key == "flag"
    with pytest.raises(RakvError, match="api-key"):
        HttpOptions.default(api_key=" ")


def metric_names(text: str) -> set[str]:
    import re

    return set(re.findall(r"\b((?:vllm|rakv):[A-Za-z0-9_]+)", text))


def exported_names() -> set[str]:
    """Every sample name a server's /metrics can carry (counters' _total, histograms' _bucket / _sum / _count)."""
    from rakv.serving.prometheus import ServerMetrics

    names = set()
    for family in ServerMetrics("x").registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def test_metrics_count_the_controller_s_actions_and_preemptions_and_the_dashboard_reads_only_those(served):
    import json
    from pathlib import Path

    served.openai.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, extra_body={"ignore_eos": True})
    text = served.http.get("/metrics").text
    assert 'rakv:request_actions_total{k="2",model_name="tiny",proposer="draft",reuse=' in text  # joint-k2
    assert "vllm:num_preemptions_total" in text and "rakv:measured_service_seconds_count" in text
    samples = metric_names("\n".join(line for line in text.splitlines() if not line.startswith("#")))
    assert {s for s in samples if not s.endswith("_created")} <= exported_names()  # what the registry declares
    dashboard = json.loads((Path(__file__).parents[1] / "docs" / "grafana" / "rakv.json").read_text())
    queried = metric_names(json.dumps([t["expr"] for p in dashboard["panels"] for t in p["targets"]]))
    assert queried and queried <= exported_names(), queried - exported_names()
    assert {"vllm:num_preemptions_total", "rakv:request_actions_total",
            "rakv:predicted_service_seconds_bucket"} <= queried
    assert not metric_names('rate(vllm:num_preemptions[5m])') <= exported_names()  # positive control: no _total


def test_the_served_fields_table_in_docs_is_the_one_the_models_give():
    import importlib.util
    from pathlib import Path

    from rakv.serving.protocol import FIELD_DOCS, honoured_fields

    script = Path(__file__).parents[1] / "scripts" / "write_serving_fields.py"
    spec = importlib.util.spec_from_file_location("write_serving_fields", script)
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    text = writer.DOC.read_text()
    assert writer.rendered(text) == text, "docs/serving.md's field table is stale: run scripts/write_serving_fields.py"
    assert writer.rendered(text.replace("| `stop` |", "| `stops` |")) != text.replace("| `stop` |", "| `stops` |")
    removed = FIELD_DOCS.pop("echo")  # positive control: a field without a line is caught
    try:
        with pytest.raises(ValueError, match="echo"):
            honoured_fields()
    finally:
        FIELD_DOCS["echo"] = removed


def test_scoring_in_chunks_gives_the_whole_forward_s_log_probabilities(tiny_pair, stock_tiny, monkeypatch):
    from rakv.serving import scoring

    ids = list(range(5, 45))
    whole = scoring.score(tiny_pair.target.module, ids, 2)
    monkeypatch.setattr(scoring, "CHUNK", 7)  # 40 positions in 6 forwards on one cache
    chunked = scoring.score(tiny_pair.target.module, ids, 2)
    assert chunked == whole and len(whole.logprobs) == len(ids) and whole.logprobs[0] is None
    reference, _ = direct_logprobs(stock_tiny, ids)
    assert max(abs(a - b) for a, b in zip(whole.logprobs[1:], reference)) < 1e-4
