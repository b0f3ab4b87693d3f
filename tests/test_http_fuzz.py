"""rakv serve --http fuzzed (rakv.bench.fuzz_http; scripts/fuzz_http.py runs the same at >= 1,000 requests):
schemathesis's property-based requests over the server's own OpenAPI schema, positive and negative data, get no 5xx
but a 503 with Retry-After, none hangs, every answer conforms to the schema, /health stays 200, and requests.jsonl
has one line per request that reached the engine; the bad inputs of docs/serving.md are each refused 4xx (or, a
malformed HTTP head, closed) with the server still serving after each; a real SIGTERM drains, writes the summary,
and is not raised again once the server has stopped (uvicorn does that by default, which ended the process first)."""

import os
import signal
import threading
import time

import pytest
import requests

from rakv.bench.fuzz_http import (
    bad_input_requests,
    bad_inputs,
    check_records,
    ended_requests,
    fuzz,
    generate,
    good_request,
    health,
    load_schema,
)
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.engine import Engine
from rakv.runtime.run_layout import ServedRunLayout
from rakv.serving.http_options import HttpOptions
from rakv.serving.http_server import make_server, serve_http
from rakv.serving.server import ServeOptions

EXAMPLES = 240  # about 30 per operation and mode for the four POST operations (the GET ones have one case each)


@pytest.fixture()
def served(tiny_pair, tmp_path):
    """A tiny server in a thread as `rakv serve --http` runs it: (its URL, its address, stop() -> its summary)."""
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    server = make_server(engine, ServeOptions.default(strategy="joint-k2", max_batch=4), ("127.0.0.1", 0), "tiny",
                         tmp_path, http=HttpOptions.default())
    result = {}
    thread = threading.Thread(target=lambda: result.update(summary=serve_http(server)), daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    host, port = server.address

    def stop():
        server.should_exit = True
        thread.join(60)
        assert not thread.is_alive(), "the server did not stop"
        return result.get("summary")

    yield f"http://{host}:{port}", (host, port), stop
    if thread.is_alive():
        stop()


@pytest.mark.heavy
def test_generated_requests_get_no_5xx_no_hang_conforming_answers_and_whole_records(served, tmp_path):
    url, _, stop = served
    cases = generate(load_schema(url), EXAMPLES, seed_value=0)
    assert len(cases) >= EXAMPLES
    tally = fuzz(url, cases, concurrency=4, health_every=50)
    assert tally.sent == len(cases)
    assert tally.server_errors == [] and tally.hung == [] and tally.dropped == []
    assert tally.nonconforming == []
    assert tally.engine_deaths == 0 and len(tally.health) >= 4
    served, refused = (sum(n for (_, status), n in tally.statuses.items() if status == code) for code in (200, 400))
    assert served >= 20 and refused >= 100  # both served and refused requests were made
    assert good_request(url) == 200 and health(url) == 200
    ended = ended_requests(url)
    assert stop() is not None
    assert check_records(tmp_path, ended, tally.answered) == []
    assert ended >= len(tally.answered) + 1


def test_the_bad_inputs_are_refused_and_the_server_serves_after_each(served):
    url, address, _ = served
    results = bad_inputs(url, address)
    assert [r.name for r, _ in results] == list(bad_input_requests())
    assert [(r.name, r.outcome, r.served_after) for r, ok in results if not ok] == []
    assert health(url) == 200


def test_a_real_sigterm_drains_writes_the_summary_and_is_not_raised_again(tiny_pair, tmp_path):
    """serve_http in the main thread, as `rakv serve --http` runs it (uvicorn installs its signal handlers there only);
    a SIGTERM the process gets must end in the drain, not in the signal raised again after it."""
    raised_again = []
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: raised_again.append(sig))
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    server = make_server(engine, ServeOptions.default(strategy="joint-k2", max_batch=4), ("127.0.0.1", 0), "tiny",
                         tmp_path, http=HttpOptions.default())
    answers = []

    def client():
        while not server.started:
            time.sleep(0.02)
        url = "http://{}:{}".format(*server.address)
        answers.append(requests.post(f"{url}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 4},
                                     timeout=60).status_code)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        summary = serve_http(server)
    finally:
        signal.signal(signal.SIGTERM, previous)
    thread.join(10)
    assert answers == [200] and raised_again == []
    assert summary is not None and summary.statistics.completed == 1
    assert ServedRunLayout(tmp_path).served_summary.exists()
