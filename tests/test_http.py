"""rakv serve --http (rakv.serving.http on FastAPI + uvicorn): driven by the official `openai` client, its outputs are
the engine's alone; a bad request is refused alone (4xx, one line, OpenAI's error shape) while the others are
served; a request whose serving raises fails alone (500) and frees its K/V; an engine that cannot go on answers
503 to everyone and on /health; the queue is bounded (429); bodies and slow clients are limited; a client that goes
away is aborted; SIGTERM drains, and the records and summary are written; /metrics counts under vLLM's names."""

import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.decoding import Sampling
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.runtime.run_layout import ServedRunLayout
from rakv.serving import engine_loop, executor
from rakv.serving.http_options import HttpOptions
from rakv.serving.http_server import make_server, parse_address, serve_http
from rakv.serving.metrics import RunSummary
from rakv.serving.protocol import ChatCompletionRequest, CompletionRequest
from rakv.serving.server import ServeOptions

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


class Served:
    """A server on a free port, run in a thread as `rakv serve --http` runs it; `stop()` returns its summary."""

    def __init__(self, pair, out, **serve):
        self.engine = Engine(pair, PrefixKVStore(budget_bytes=1 << 30))
        http = HttpOptions.default(**{k: serve.pop(k) for k in list(serve) if k in HttpOptions.__dataclass_fields__})
        options = ServeOptions.default(**{"strategy": "joint-k2", "max_batch": 4, **serve})
        self.server = make_server(self.engine, options, ("127.0.0.1", 0), "tiny", out, http=http)
        self.loop = self.server.engine_loop
        self.result: dict = {}
        self.thread = threading.Thread(target=lambda: self.result.update(summary=serve_http(self.server)), daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        host, port = self.server.address
        self.url = f"http://{host}:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=60)
        self.openai = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def post(self, body, path="/v1/completions") -> httpx.Response:
        if isinstance(body, bytes):
            return self.http.post(path, content=body, headers={"Content-Type": "application/json"})
        return self.http.post(path, json=body)

    def stop(self) -> RunSummary | None:
        self.server.should_exit = True
        self.thread.join(60)
        return self.result.get("summary")


@pytest.fixture()
def served(tiny_pair, tmp_path):
    server = Served(tiny_pair, tmp_path)
    yield server
    server.stop()


def alone(engine: Engine, prompt: str, new_tokens: int) -> list[int]:
    """Greedy AR, batch one, an empty store: the output every served greedy request must equal."""
    fresh = Engine(engine.pair, PrefixKVStore(budget_bytes=1 << 30))
    return fresh.run(fresh.encode(prompt), Action(False, 0), new_tokens, ignore_eos=True).token_ids


def test_the_openai_client_gets_the_engine_s_output_alone_streamed_or_not(served):
    engine, client = served.engine, served.openai
    expected = engine.pair.tokenizer.decode(alone(engine, PROMPT, 12), skip_special_tokens=True)
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, extra_body={"ignore_eos": True})
    assert whole.choices[0].text == expected and whole.usage.completion_tokens == 12
    assert whole.choices[0].finish_reason == "length"
    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].usage.completion_tokens == 12
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}]
    rendered = engine.pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10,
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == engine.pair.tokenizer.decode(alone(engine, rendered, 10),
                                                                           skip_special_tokens=True)
    streamed = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, stream=True,
                                              extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == chat.choices[0].message.content
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert all(r.ok for r in served.loop.core.records) and len(served.loop.core.records) == 4


def test_bad_requests_are_refused_alone_with_one_line_while_the_others_are_served(served):
    bad = [b"not json", {"prompt": ""}, {"prompt": ["a", ""]}, {"prompt": PROMPT, "max_tokens": 0},
           {"prompt": PROMPT, "temperature": -1}, {"prompt": PROMPT, "temperature": 1e-40},
           {"prompt": PROMPT, "temperature": 1, "seed": 1 << 64}, {"prompt": PROMPT, "n": 0},
           {"prompt": PROMPT, "stop": [""]}, {"prompt": PROMPT, "max_tokens": 10 ** 6}, {"prompt": [10 ** 9]},
           {"prompt": [1] * 2000}, b'{"prompt": "x", "max_tokens": Infinity}', b'{"prompt": "x", "top_p": NaN}',
           {"prompt": PROMPT, "max_tokens": "5"}, {"prompt": "x " * 200_000}]
    good = [{"prompt": PROMPT + str(i), "max_tokens": 8, "ignore_eos": True, "stream": i % 2 == 0} for i in range(4)]
    results = {}
    threads = [threading.Thread(target=lambda i=i, b=b: results.update({i: served.post(b)}))
               for i, b in enumerate(good + bad)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[i].status_code == 200 for i in range(len(good)))
    for i, body in enumerate(bad, len(good)):
        error = results[i].json()["error"]
        assert results[i].status_code == 400 and error["message"] and "\n" not in error["message"], (body, error)
        assert error["type"] == "BadRequestError" and error["code"] == 400
    assert "characters" in results[len(good) + len(bad) - 1].json()["error"]["message"]  # refused untokenised
    answer = served.post({"prompt": PROMPT, "model": "another"})
    assert answer.status_code == 404 and "tiny" in answer.json()["error"]["message"]
    assert [r.status for r in served.loop.core.records] == ["ok"] * 4  # the refused never reached the engine
    with pytest.raises(openai.BadRequestError, match="temperature"):
        served.openai.completions.create(model="tiny", prompt=PROMPT, temperature=1e-40)


def test_a_request_whose_serving_raises_fails_alone_and_frees_its_kv(served, monkeypatch):
    select = executor.select_token

    def faulty(logits, sampling, generator):
        if sampling.seed == 666:
            raise RuntimeError("probability tensor contains either inf, nan or element < 0\nsecond line")
        return select(logits, sampling, generator)

    monkeypatch.setattr(executor, "select_token", faulty)
    bodies = [{"prompt": PROMPT + str(i), "max_tokens": 8, "ignore_eos": True, "temperature": 0.8,
               "seed": 666 if i == 2 else i} for i in range(4)]
    results = {}
    threads = [threading.Thread(target=lambda i=i, b=b: results.update({i: served.post(b)})) for i, b in
               enumerate(bodies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[i].status_code for i in range(4)] == [200, 200, 500, 200]
    message = results[2].json()["error"]["message"]
    assert message == "RuntimeError: probability tensor contains either inf, nan or element < 0"
    records = {r.id: r for r in served.loop.core.records}
    assert sorted(r.status for r in records.values()) == ["failed", "ok", "ok", "ok"]
    assert not served.loop.scheduler.running and not served.loop.core.executor.kv.slots
    assert served.http.get("/health").status_code == 200
    assert served.post({"prompt": PROMPT, "max_tokens": 4}).status_code == 200


def test_a_failing_iteration_fails_its_requests_and_an_engine_that_cannot_go_on_answers_503(served, monkeypatch):
    forward, broken = executor.forward_rows, {"on": True}

    def shared_part(*args, **kwargs):
        if broken["on"]:
            raise RuntimeError("the batched forward failed")
        return forward(*args, **kwargs)

    monkeypatch.setattr(executor, "forward_rows", shared_part)
    answer = served.post({"prompt": PROMPT, "max_tokens": 4})
    assert answer.status_code == 500 and "the batched forward failed" in answer.json()["error"]["message"]
    broken["on"] = False
    assert served.post({"prompt": PROMPT, "max_tokens": 4}).status_code == 200  # a failure is not a death
    broken["on"] = True
    statuses = [served.post({"prompt": PROMPT + str(i), "max_tokens": 4}).status_code
                for i in range(engine_loop.MAX_FAILED_ITERATIONS)]
    assert statuses[:-1] == [500] * (engine_loop.MAX_FAILED_ITERATIONS - 1) and statuses[-1] == 503
    health = served.http.get("/health")
    assert health.status_code == 503 and "iterations failed in a row" in health.json()["reason"]
    answer = served.post({"prompt": PROMPT, "max_tokens": 4})
    assert answer.status_code == 503 and answer.headers["Retry-After"]
    assert 'rakv:engine_alive{model_name="tiny"} 0.0' in served.http.get("/metrics").text


def test_the_queue_is_bounded_beyond_it_429_with_retry_after(tiny_pair, tmp_path):
    served = Served(tiny_pair, tmp_path, max_batch=1, max_waiting=1)
    try:
        results = {}
        threads = [threading.Thread(target=lambda i=i: results.update({i: served.post(
            {"prompt": PROMPT + str(i), "max_tokens": 200, "ignore_eos": True})})) for i in range(2)]
        for thread in threads:
            thread.start()
        while served.loop.in_flight < 2:
            time.sleep(0.01)
        refused = served.post({"prompt": PROMPT, "max_tokens": 4})
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        for thread in threads:
            thread.join()
        assert [results[i].status_code for i in range(2)] == [200, 200]
        assert served.post({"prompt": PROMPT, "max_tokens": 4}).status_code == 200
    finally:
        served.stop()


def test_bodies_and_slow_clients_are_limited(tiny_pair, tmp_path):
    served = Served(tiny_pair, tmp_path, max_body_mib=0.01, read_timeout_s=1.0)
    try:
        too_large = served.post(json.dumps({"prompt": "x" * 20_000}).encode())
        assert too_large.status_code == 413 and too_large.json()["error"]["type"] == "RequestTooLargeError"
        host, port = served.server.address
        with socket.create_connection((host, port)) as slow:  # a body that does not arrive: 408
            slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"prompt\"")
            slow.settimeout(10)
            assert slow.recv(64).startswith(b"HTTP/1.1 408")
        with socket.create_connection((host, port)) as idle:  # a head that does not arrive: closed
            idle.sendall(b"POST /v1/comp")
            idle.settimeout(10)
            started = time.time()
            assert idle.recv(64) == b"" and time.time() - started < 5
        with socket.create_connection((host, port)) as framing:  # a Content-Length that is not a number
            framing.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
            framing.settimeout(10)
            assert framing.recv(64).startswith(b"HTTP/1.1 400")
        huge = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n{}"
        with socket.create_connection((host, port)) as claims:
            claims.sendall(huge)
            claims.settimeout(10)
            assert claims.recv(64).startswith(b"HTTP/1.1 413")
        assert served.post({"prompt": PROMPT, "max_tokens": 4}).status_code == 200
    finally:
        served.stop()


def test_a_client_that_goes_away_is_aborted_and_its_kv_freed(served):
    host, port = served.server.address
    body = json.dumps({"prompt": PROMPT, "max_tokens": 900, "stream": True, "ignore_eos": True}).encode()
    with socket.create_connection((host, port)) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert conn.recv(64).startswith(b"HTTP/1.1 200")  # streaming has begun
    deadline = time.time() + 30
    while not any(r.status == "aborted" for r in served.loop.core.records) and time.time() < deadline:
        time.sleep(0.1)
    aborted = [r for r in served.loop.core.records if r.status == "aborted"]
    assert len(aborted) == 1 and aborted[0].new_tokens < 900
    assert not served.loop.scheduler.running and not served.loop.core.executor.kv.slots
    assert 'rakv:kv_bytes{model_name="tiny"} 0.0' in served.http.get("/metrics").text
    assert served.post({"prompt": PROMPT, "max_tokens": 4}).status_code == 200  # and the server goes on


def test_sigterm_drains_running_requests_then_writes_the_records_and_summary(served):
    with served.http.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 60, "stream": True,
                                                             "ignore_eos": True}) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line).startswith("data: ")
        served.server.handle_exit(signal.SIGTERM, None)  # as the signal would
        assert served.loop.health() == ("draining", "the server is shutting down")
        with pytest.raises(engine_loop.Unavailable, match="shutting down"):  # a new request: 503
            served.loop.submit(served.loop.new_request([1, 2], 4, Sampling(), True), lambda event: None)
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]" and json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
    summary = served.stop()
    assert summary.statistics.completed == 1 and summary.statistics.failed == 0
    written = ServedRunLayout(served.loop.core.out)
    lines = written.requests.read_text().splitlines()
    assert [json.loads(line)["status"] for line in lines] == ["ok"]
    assert written.served_summary.exists() and written.iterations.exists()


def test_metrics_count_requests_tokens_prefix_hits_and_drafts_under_vllm_s_names(served):
    for _ in range(2):  # an exact repeat: a store hit
        assert served.post({"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True}).status_code == 200
    text = served.http.get("/metrics").text
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line and not line.startswith("#")}
    label = '{model_name="tiny"}'
    assert samples['vllm:request_success_total{finished_reason="length",model_name="tiny"}'] == 2
    assert samples[f"vllm:generation_tokens_total{label}"] == 12
    assert samples[f"vllm:prefix_cache_hits_total{label}"] > 0
    assert samples[f"vllm:prefix_cache_queries_total{label}"] == 2 * samples[f"vllm:prompt_tokens_total{label}"] / 2
    assert samples[f"vllm:spec_decode_num_draft_tokens_total{label}"] > 0  # joint-k2 speculates
    assert samples[f"vllm:time_to_first_token_seconds_count{label}"] == 2
    assert samples[f"vllm:num_requests_running{label}"] == 0
    schema = served.http.get("/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"} <= set(schema["paths"])


def test_request_bodies_are_checked_field_by_field():
    parsed = CompletionRequest.model_validate({"prompt": ["x"], "temperature": 0.7, "top_p": 0.9, "seed": 4})
    assert parsed.prompts == ["x"] and parsed.max_tokens == 16 and parsed.temperature == 0.7
    assert CompletionRequest.model_validate({"prompt": [[5, 6]]}).prompts == [[5, 6]]
    assert CompletionRequest.model_validate({"prompt": [5, 6]}).prompts == [[5, 6]]
    for body, message in [({"prompt": "x", "max_tokens": 1.5}, "max_tokens"), ({"prompt": "x", "top_p": 0}, "top_p"),
                          ({"prompt": "x", "seed": True}, "seed"), ({"prompt": [True]}, "prompt"),
                          ({"prompt": "x", "echo": 1}, "echo"), ({"prompt": ["a"] * 65}, "at most 64 items"),
                          ({"prompt": "x", "tools": [{}]}, "'tools' is not supported"),
                          ({"prompt": "x", "temperature": float("inf")}, "temperature"),
                          ({"prompt": "x", "seed": -(1 << 63) - 1}, "seed")]:
        with pytest.raises(ValueError, match=message):
            CompletionRequest.model_validate(body)
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "max_completion_tokens": 3})
    assert chat.messages[0].text == "ab" and chat.new_tokens == 3
    with pytest.raises(ValueError, match="messages"):
        ChatCompletionRequest.model_validate({"messages": []})
    assert parse_address("127.0.0.1:8000") == ("127.0.0.1", 8000) and parse_address(":9") == ("127.0.0.1", 9)
    with pytest.raises(RakvError, match="HOST:PORT"):
        parse_address("localhost")
