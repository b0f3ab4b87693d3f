"""rakv serve --http (rakv.serving.http): the OpenAI-compatible endpoint on the engine step loop — its outputs are
the engine's, streamed chunks add up to the whole text, a bad request is refused alone while others are served, a
client that goes away is aborted with its K/V freed, and the records and summary are written at the end."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.decoding import Sampling
from rakv.runtime.engine import Engine
from rakv.runtime.errors import RakvError
from rakv.serving.http import BadRequest, make_server, parse_address, parse_completion
from rakv.serving.server import ServeOptions

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


@pytest.fixture()
def endpoint(tiny_pair, tmp_path):
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    server, loop = make_server(engine, ServeOptions.default(strategy="joint-k2", max_batch=4), ("127.0.0.1", 0),
                               "tiny", tmp_path)
    threads = [threading.Thread(target=loop.run, daemon=True), threading.Thread(target=server.serve_forever,
                                                                                  daemon=True)]
    for thread in threads:
        thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", engine, loop
    server.shutdown()
    server.server_close()
    loop.stopping.set()
    threads[0].join()


def post(url: str, body) -> tuple[int, dict | list]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", data=data), timeout=60) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    if text.startswith("data: "):
        events = [line[len("data: "):] for line in text.split("\n\n") if line]
        assert events[-1] == "[DONE]", events[-1]
        return status, [json.loads(e) for e in events[:-1]]
    return status, json.loads(text)


def test_greedy_completions_are_the_engine_s_output_alone_and_stream_to_the_same_text(endpoint):
    url, engine, loop = endpoint
    alone = Engine(engine.pair, PrefixKVStore(budget_bytes=1 << 30)).run(engine.encode(PROMPT), Action(False, 0), 12,
                                                                         ignore_eos=True)
    status, body = post(url, {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "model": "tiny"})
    assert status == 200 and body["usage"]["completion_tokens"] == 12
    assert body["choices"][0]["text"] == engine.pair.tokenizer.decode(alone.token_ids, skip_special_tokens=True)
    status, events = post(url, {"prompt": engine.encode(PROMPT), "max_tokens": 12, "ignore_eos": True,
                                "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and events[-1]["usage"]["completion_tokens"] == 12 and events[-1]["choices"] == []
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == body["choices"][0]["text"]
    assert [r.token_ids for r in loop.core.records if r.ok] == [alone.token_ids] * 2


def test_bad_requests_are_refused_alone_while_the_others_are_served(endpoint):
    url, engine, loop = endpoint
    bad = [b"not json", {"prompt": ""}, {"prompt": ["a", "b"]}, {"prompt": PROMPT, "max_tokens": 0},
           {"prompt": PROMPT, "temperature": -1}, {"prompt": PROMPT, "n": 2}, {"prompt": PROMPT, "stop": ["\n"]},
           {"prompt": PROMPT, "max_tokens": 10 ** 6}, {"prompt": [10 ** 9]}]
    results = {}

    def send(i, body):
        results[i] = post(url, body)

    good = [{"prompt": PROMPT + str(i), "max_tokens": 8, "ignore_eos": True, "stream": i % 2 == 0} for i in range(4)]
    threads = [threading.Thread(target=send, args=(i, b)) for i, b in enumerate(good + bad)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[i][0] == 200 for i in range(len(good)))
    for i in range(len(good), len(good) + len(bad)):
        status, body = results[i]
        assert status == 400 and body["error"]["message"], (bad[i - len(good)], body)
    status, body = post(url, {"prompt": PROMPT, "model": "another"})
    assert status == 404 and "tiny" in body["error"]["message"]


def test_a_client_that_goes_away_is_aborted_and_its_kv_freed(endpoint):
    url, engine, loop = endpoint
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({"prompt": PROMPT, "max_tokens": 900, "stream": True, "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert conn.recv(64).startswith(b"HTTP/1.1 200")  # streaming has begun
    deadline = time.time() + 30
    while not any(r.status == "aborted" for r in loop.core.records) and time.time() < deadline:
        time.sleep(0.1)
    aborted = [r for r in loop.core.records if r.status == "aborted"]
    assert len(aborted) == 1 and aborted[0].new_tokens < 900
    assert not loop.scheduler.running and not loop.core.executor.kv.slots
    assert post(url, {"prompt": PROMPT, "max_tokens": 4})[0] == 200  # and the server goes on


def test_the_summary_and_records_are_written_when_the_server_stops(endpoint):
    url, engine, loop = endpoint
    post(url, {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True})
    post(url, {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True})  # an exact repeat: a store hit
    post(url, {"prompt": ""})  # refused before the engine: not a request of the run
    summary = loop.finish()
    assert summary["completed"] == 2 and summary["failed"] == 0 and summary["prefix_hit_rate"] > 0
    lines = (loop.core.out / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line)["status"] for line in lines] == ["ok", "ok"]
    assert (loop.core.out / "summary.json").exists() and (loop.core.out / "iterations.jsonl").read_text()


def test_completion_bodies_are_checked_field_by_field():
    default = Sampling(temperature=0.0)
    parsed = parse_completion(b'{"prompt": ["x"], "temperature": 0.7, "top_p": 0.9, "seed": 4}', "m", default, False)
    assert parsed.prompt == "x" and parsed.sampling == Sampling(0.7, 0.9, 4) and parsed.max_tokens == 16
    assert parse_completion(b'{"prompt": [5, 6]}', "m", Sampling(0.5), True).sampling.temperature == 0.5
    for body, message in [(b'{"prompt": "x", "max_tokens": 1.5}', "max_tokens"),
                          (b'{"prompt": "x", "top_p": 0}', "top_p"), (b'{"prompt": "x", "seed": true}', "seed"),
                          (b'[1]', "object"), (b'{"prompt": [true]}', "prompt"),
                          (b'{"prompt": "x", "echo": true}', "echo")]:
        with pytest.raises(BadRequest, match=message):
            parse_completion(body, "m", default, False)
    assert parse_address("127.0.0.1:8000") == ("127.0.0.1", 8000) and parse_address(":9") == ("127.0.0.1", 9)
    with pytest.raises(RakvError, match="HOST:PORT"):
        parse_address("localhost")
