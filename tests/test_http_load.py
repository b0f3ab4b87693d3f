"""scripts/load_http.py's accounting, small and fast: users streaming at an in-process `rakv serve --http` with a share
of their streams cut, then every request a client saw admitted has exactly one record (ok, or aborted if cut), and
the K/V is freed once idle (docs/serving.md, "Over HTTP"). The full load (64 users, 5 minutes, smollm2) is the
script's."""

import threading
import time

import pytest

from rakv.bench.load_client import ClientLog, Mix, Outcome, read_logs
from rakv.bench.load_http import account, drawn_until, load_prompts, run_users, wait_idle
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.engine import Engine
from rakv.runtime.run_layout import ServedRunLayout
from rakv.serving.http_options import HttpOptions
from rakv.serving.http_server import make_server, serve_http
from rakv.serving.records import RequestRecord, read_records
from rakv.serving.server import ServeOptions

USERS, LOAD_S = 12, 15.0


@pytest.fixture()
def server(tiny_pair, tmp_path):
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    server = make_server(engine, ServeOptions.default(strategy="ar", max_batch=8), ("127.0.0.1", 0), "tiny", tmp_path,
                         http=HttpOptions.default())
    thread = threading.Thread(target=serve_http, args=(server,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield server, thread
    server.should_exit = True
    thread.join(60)


def test_under_load_with_cut_streams_every_admitted_request_is_recorded_once_and_the_kv_freed(server, tmp_path):
    server, thread = server
    url = "http://{}:{}".format(*server.address)
    mix = Mix(load_prompts(40, 32, seed=0), chat_share=0.2, cut_share=0.3, max_tokens=(16, 32))
    log = ClientLog(tmp_path / "clients.jsonl")
    run_users(url, USERS, drawn_until(mix, time.monotonic() + LOAD_S, seed=0), log)
    log.close()
    idle = wait_idle(url, timeout_s=60)
    server.should_exit = True  # the engine stops and records what is left: nothing, once idle
    thread.join(60)
    outcomes, records = read_logs([tmp_path / "clients.jsonl"]), read_records(ServedRunLayout(tmp_path).requests)
    accounting = account(outcomes, records)
    assert accounting.holds, accounting.problems[:5]
    assert idle.kv_bytes == 0 and idle.running == 0
    assert accounting.admitted == len(outcomes) == len(records) > USERS
    assert accounting.outcomes["finished"] > 0 and accounting.outcomes["cut"] > 0
    assert 0 < accounting.statuses["aborted"] <= accounting.outcomes["cut"]


def record(request_id: str, status: str, tokens: int = 4) -> RequestRecord:
    fields = dict.fromkeys(RequestRecord.__dataclass_fields__)
    return RequestRecord(**{**fields, "id": request_id, "status": status, "new_tokens": tokens})


def seen(request_id: str | None, outcome: str, tokens: int | None = 4) -> Outcome:
    return Outcome("/v1/completions", None, id=request_id, outcome=outcome, completion_tokens=tokens)


def test_the_accounting_catches_lost_duplicated_and_misrecorded_requests():
    clean = [seen("a", "finished"), seen("b", "cut"), seen("c", "cut"), seen(None, "refused"), seen(None, "cut")]
    records = [record("a", "ok"), record("b", "aborted"), record("c", "ok"), record("d", "aborted")]
    assert account(clean, records).holds  # c finished before its cut was noticed; d's client left before an event
    broken = {"lost": records[1:], "duplicated": records + [record("b", "aborted")],
              "a finished request recorded aborted": [record("a", "aborted")] + records[1:],
              "fewer tokens recorded than streamed": [record("a", "ok", 3)] + records[1:],
              "a cut request failed": records[:2] + [record("c", "failed")] + records[3:],
              "a record nobody asked for": records + [record("e", "aborted")],
              "an unseen request finished": records + [record("e", "ok")]}
    for what, these in broken.items():
        assert not account(clean, these).holds, what
    assert not account(clean + [seen(None, "http-500")], records).holds
    assert not account(clean + [seen("a", "finished")], records).holds  # one id seen twice
