"""scripts/fuzz_http.py's parts (and tests/test_http_fuzz.py's): `rakv serve --http` fuzzed with schemathesis over its
own OpenAPI schema, then the bad inputs of docs/serving.md's "Over HTTP" sent raw, then its records checked.

- `generate`: property-based cases for every operation of the live /openapi.json, positive and negative data
  (hypothesis through schemathesis's `as_strategy`, seeded). `cap` lowers a generated `max_tokens` /
  `max_completion_tokens` that the server would admit (within the context) to `CAP_TOKENS`, and a valid `n` or list of
  prompts to `CAP_CHOICES` of them, so that a thousand requests take minutes, not hours; values beyond the limits
  are sent as generated (they are refused at once).
- `send`: one case with a client-side timeout; its answer tallied (`Tally`): its status; a 5xx other than a 503 with
  Retry-After (overload or drain) as a server error; a timeout as hung; a connection closed without an answer as
  dropped; schemathesis's conformance checks (status code documented, content type, body schema; negative data
  refused) and, for a stream, well-formed server-sent events ending in [DONE], as non-conforming.
- `bad_inputs`: the inputs that could stop the old server (an out-of-range seed, a tiny temperature, JSON Infinity
  / NaN, huge, negative or non-numeric Content-Length, 10^6-token prompts) and bad values of the evaluation tools'
  fields (`stop`, `n`, a list of prompts, `logprobs`, `echo`, /tokenize, /detokenize), sent over a raw socket; each
  must be answered 4xx (a malformed head may instead be closed) and a good request served after it.
- `check_records`: after the server stopped, requests.jsonl has one line per request that reached the engine (as
  many as /metrics counted), no id twice, every answered completion among them; summary.json written.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from rakv.runtime.run_layout import ServedRunLayout
from rakv.serving.protocol import MAX_N, MAX_PROMPTS
from rakv.serving.records import read_records

CAP_TOKENS = 32  # a generated max_tokens the server would admit is lowered to this (a cost cap, not a validity one)
CAP_CHOICES = 2  # ... and a valid n, or a valid list of prompts, to this many
TIMEOUT_S = 60.0  # a request not answered within this is hung
GOOD = {"prompt": "def fibonacci(n):", "max_tokens": 4, "temperature": 0}
ENDED = re.compile(r'^(?:vllm:request_success_total|rakv:requests_ended_total)\{[^}]*\} ([0-9.eE+]+)$', re.M)
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")


def checks() -> list:
    """schemathesis's checks run on every answer (its 5xx check is ours: a 503 with Retry-After is allowed)."""
    c = schemathesis.checks
    return [c.status_code_conformance, c.content_type_conformance, c.response_schema_conformance,
            c.response_headers_conformance, c.negative_data_rejection]


@dataclass
class Tally:
    """What the fuzzed requests got. Lists hold one line per fault (with a reproducer where schemathesis gives one)."""

    statuses: Counter = field(default_factory=Counter)  # (mode, status or "hung" / "dropped") -> requests
    refusals: Counter = field(default_factory=Counter)  # positive data refused 4xx: (status, message) -> requests
    server_errors: list[str] = field(default_factory=list)  # 5xx other than 503-with-Retry-After
    hung: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    nonconforming: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)  # ids of the completions answered 200
    health: list[int | None] = field(default_factory=list)  # /health's status at each check (None: no answer)
    sent: int = 0
    capped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def engine_deaths(self) -> int:
        return sum(status != 200 for status in self.health)


def load_schema(base_url: str):
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json", timeout=TIMEOUT_S)


def generate(schema, total: int, seed_value: int = 0) -> list:
    """At least `total` cases over every operation, positive and negative data, as evenly as the operations allow
    (an operation without parameters has one case): rounds of `per` examples per operation and mode, with a new
    seed each round, until enough."""
    operations = [result.ok() for result in schema.get_all_operations()]
    plans = [(op, mode) for op in operations for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
    cases, exhausted, round_ = [], set(), 0
    while len(cases) < total and len(exhausted) < len(plans):
        open_plans = [i for i in range(len(plans)) if i not in exhausted]
        per = math.ceil((total - len(cases)) / len(open_plans))
        for i in open_plans:
            drawn = draw(*plans[i], per, seed_value + 1000 * round_ + i)
            if len(drawn) < per:
                exhausted.add(i)
            cases.extend(drawn)
        round_ += 1
    return cases


def draw(operation, mode, examples: int, seed_value: int) -> list:
    """Up to `examples` cases of one operation in one mode (fewer where hypothesis runs out of distinct ones)."""
    drawn = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(seed_value)
    def collect(case):
        drawn.append(case)

    try:
        collect()
    except Unsatisfiable:  # e.g. negative data for an operation that takes none
        pass
    return drawn


def cap(case, max_context: int) -> bool:
    """Lower a generated token count the server would admit to CAP_TOKENS; True if one was."""
    body, capped = case.body, False
    if isinstance(body, dict):
        for name in TOKEN_FIELDS:
            value = body.get(name)
            if type(value) is int and CAP_TOKENS < value <= max_context:
                body[name], capped = CAP_TOKENS, True
        n, prompt = body.get("n"), body.get("prompt")
        if type(n) is int and CAP_CHOICES < n <= MAX_N:
            body["n"], capped = CAP_CHOICES, True
        if isinstance(prompt, list) and CAP_CHOICES < len(prompt) <= MAX_PROMPTS \
                and all(isinstance(p, (str, list)) for p in prompt):
            body["prompt"], capped = prompt[:CAP_CHOICES], True
    return capped


def send(case, base_url: str, session: requests.Session, tally: Tally) -> None:
    """One case: sent, its answer checked and tallied."""
    where, mode = f"{case.method} {case.path}", case.meta.generation.mode.value
    try:
        response = case.call(base_url=base_url, session=session, timeout=TIMEOUT_S)
    except requests.Timeout:
        return record(tally, mode, "hung", f"{where}: no answer within {TIMEOUT_S:g} s: {case.as_curl_command()}")
    except requests.RequestException as exc:
        return record(tally, mode, "dropped", f"{where}: {type(exc).__name__}: {exc}")
    status = response.status_code
    faults = []
    if status >= 500 and not (status == 503 and "retry-after" in response.headers):  # (lowercase keys)
        faults.append(("server_errors", f"{where} -> {status} {response.text[:200]}: {case.as_curl_command()}"))
    try:
        case.validate_response(response, checks=checks())
    except (schemathesis.errors.FailureGroup, Exception) as exc:  # (a BaseExceptionGroup): the failures, a curl
        faults.append(("nonconforming", f"{where} -> {status}: {' '.join(str(exc).split())[:600]}"))
    answered = None
    if status == 200 and case.method.upper() == "POST":
        answered, problem = answer_id(response)
        if problem:
            faults.append(("nonconforming", f"{where} -> 200: {problem}: {case.as_curl_command()}"))
    with tally.lock:
        tally.sent += 1
        tally.statuses[mode, status] += 1
        if mode == "positive" and 400 <= status < 500:
            tally.refusals[status, refusal(response)] += 1
        if answered:
            tally.answered.append(answered)
        for kind, line in faults:
            getattr(tally, kind).append(line)


def record(tally: Tally, mode: str, kind: str, line: str) -> None:
    with tally.lock:
        tally.sent += 1
        tally.statuses[mode, kind] += 1
        getattr(tally, kind).append(line)


def refusal(response) -> str:
    """An error answer's message, its values blanked (so that refusals group by reason)."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text[:80]
    return re.sub(r"'[^']*'|\d+", "_", message)[:100]


def answer_id(response) -> tuple[str | None, str | None]:
    """A 200 completion's id, and what is wrong with it (a stream: every event JSON, the last [DONE])."""
    if not response.headers.get("content-type", [""])[0].startswith("text/event-stream"):  # (lists of values)
        try:
            body = response.json()
        except ValueError:
            return None, "the body is not JSON"
        return (body.get("id") if isinstance(body, dict) else None), None
    events = [block[len("data: "):] for block in response.text.split("\n\n") if block.strip()]
    if not events or events[-1] != "[DONE]":
        return None, "the stream does not end with data: [DONE]"
    try:
        chunks = [json.loads(event) for event in events[:-1]]
    except ValueError:
        return None, "an event of the stream is not JSON"
    return (chunks[0].get("id") if chunks else None), None


def health(base_url: str) -> int | None:
    try:
        return requests.get(f"{base_url}/health", timeout=TIMEOUT_S).status_code
    except requests.RequestException:
        return None


def fuzz(base_url: str, cases: list, concurrency: int = 4, health_every: int = 100) -> Tally:
    """Send every case (`concurrency` clients), /health checked every `health_every` answers and at the end."""
    tally, local = Tally(), threading.local()
    max_context = requests.get(f"{base_url}/v1/models", timeout=TIMEOUT_S).json()["data"][0]["max_model_len"]
    tally.capped = sum(cap(case, max_context) for case in cases)

    def one(case):
        if not hasattr(local, "session"):
            local.session = requests.Session()
        send(case, base_url, local.session, tally)

    with ThreadPoolExecutor(concurrency) as pool:
        for done, _ in enumerate(pool.map(one, cases), 1):
            if done % health_every == 0:
                tally.health.append(health(base_url))
    tally.health.append(health(base_url))
    return tally


def good_request(base_url: str) -> int | None:
    """A greedy completion's status (None: no answer)."""
    try:
        return requests.post(f"{base_url}/v1/completions", json=GOOD, timeout=TIMEOUT_S).status_code
    except requests.RequestException:
        return None


def ended_requests(base_url: str) -> int:
    """Requests that have left the engine, by /metrics: finished (by finish reason) + refused, aborted, failed."""
    text = requests.get(f"{base_url}/metrics", timeout=TIMEOUT_S).text
    return int(sum(float(value) for value in ENDED.findall(text)))


# --- the bad inputs, raw ---

def http_request(body: bytes | str, length: str | None = None, path: str = "/v1/completions") -> bytes:
    body = body.encode() if isinstance(body, str) else body
    head = (f"POST {path} HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\nConnection: close\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n")
    return head.encode() + body


def bad_input_requests() -> dict[str, tuple[bytes, bool]]:
    """Name -> (the raw request, whether closing without an answer is also acceptable: malformed HTTP framing)."""
    long_text = "hi " * 10 ** 6  # about 10^6 tokens, 3 MB: under the body limit, over the context
    return {
        "seed 2^64, temperature 0.7": (http_request(f'{{"prompt": "hi", "seed": {1 << 64}, "temperature": 0.7}}'),
                                       False),
        "seed -2^63-1, temperature 0.7": (http_request(
            f'{{"prompt": "hi", "seed": {-(1 << 63) - 1}, "temperature": 0.7}}'), False),
        "temperature 1e-40": (http_request('{"prompt": "hi", "temperature": 1e-40, "seed": 1}'), False),
        "max_tokens Infinity": (http_request('{"prompt": "hi", "max_tokens": Infinity}'), False),
        "max_tokens NaN": (http_request('{"prompt": "hi", "max_tokens": NaN}'), False),
        "temperature -Infinity": (http_request('{"prompt": "hi", "temperature": -Infinity}'), False),
        "Content-Length 10^12, 20-byte body": (http_request('{"prompt": "hi"}    ', str(10 ** 12)), False),
        "Content-Length -1": (http_request('{"prompt": "hi"}', "-1"), True),
        "Content-Length abc": (http_request('{"prompt": "hi"}', "abc"), True),
        "a 5 MiB body": (http_request(json.dumps({"prompt": "x" * (5 << 20)})), False),
        "prompt of 10^6 tokens (3 MB string)": (http_request(json.dumps({"prompt": long_text})), False),
        "prompt of 10^6 token ids": (http_request(json.dumps({"prompt": [1] * 10 ** 6})), False),
        "chat message of 10^6 tokens": (http_request(json.dumps({"messages": [{"role": "user", "content": long_text}]}),
                                                     path="/v1/chat/completions"), False),
        "stop: 10^5 strings": (http_request(json.dumps({"prompt": "hi", "stop": ["a"] * 10 ** 5})), False),
        "stop: one of 10^6 characters": (http_request(json.dumps({"prompt": "hi", "stop": "x" * 10 ** 6})), False),
        "stop: an empty string": (http_request('{"prompt": "hi", "stop": [""]}'), False),
        "n 10^9": (http_request('{"prompt": "hi", "n": 1000000000, "temperature": 1}'), False),
        "n 2, greedy": (http_request('{"prompt": "hi", "n": 2, "temperature": 0}'), False),
        "10^5 prompts": (http_request(json.dumps({"prompt": ["hi"] * 10 ** 5})), False),
        "logprobs 10^9": (http_request('{"prompt": "hi", "logprobs": 1000000000}'), False),
        "stream, logprobs 10^9": (http_request('{"prompt": "hi", "logprobs": 1000000000, "stream": true}'), False),
        "stream, logprobs a string": (http_request('{"prompt": "hi", "logprobs": "1", "stream": true}'), False),
        "echo, max_tokens 0, 10^6 token ids": (http_request(json.dumps(
            {"prompt": [1] * 10 ** 6, "echo": True, "max_tokens": 0, "logprobs": 1})), False),
        "max_tokens 0 without echo": (http_request('{"prompt": "hi", "max_tokens": 0}'), False),
        "stream, echo not a boolean": (http_request('{"prompt": "hi", "echo": 1, "stream": true}'), False),
        "stream, echo, max_tokens 0, 10^6 token ids": (http_request(json.dumps(
            {"prompt": [1] * 10 ** 6, "echo": True, "max_tokens": 0, "logprobs": 1, "stream": True})), False),
        "stream, max_tokens 0 without echo": (http_request('{"prompt": "hi", "max_tokens": 0, "stream": true}'),
                                              False),
        "echo not a boolean": (http_request('{"prompt": "hi", "echo": "yes"}'), False),
        "logprobs -1": (http_request('{"prompt": "hi", "logprobs": -1}'), False),
        "n 0": (http_request('{"prompt": "hi", "n": 0}'), False),
        "stop a number": (http_request('{"prompt": "hi", "stop": 5}'), False),
        "an empty list of prompts": (http_request('{"prompt": []}'), False),
        "a prompt of no token ids": (http_request('{"prompt": [[]]}'), False),
        "chat top_logprobs without logprobs": (http_request(
            '{"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}', path="/v1/chat/completions"),
            False),
        "chat top_logprobs 10^9": (http_request(
            '{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 1000000000}',
            path="/v1/chat/completions"), False),
        "/tokenize of 10^6 tokens": (http_request(json.dumps({"prompt": long_text}), path="/tokenize"), False),
        "/detokenize of ids outside the vocabulary": (http_request('{"tokens": [1000000000, 5]}',
                                                                   path="/detokenize"), False),
    }


def exchange(address: tuple[str, int], data: bytes, timeout_s: float = TIMEOUT_S) -> tuple[int | str, float]:
    """Send raw bytes, read the answer's status: (the status, or what happened instead; seconds taken)."""
    start = time.monotonic()
    with socket.create_connection(address, timeout=timeout_s) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered (or closed) before the whole body was sent: read what it said
        received = b""
        try:
            while b"\r\n" not in received:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except TimeoutError:
            return "no answer (timeout)", time.monotonic() - start
        except ConnectionResetError:
            pass
    took = time.monotonic() - start
    match = re.match(rb"HTTP/1\.[01] (\d{3})", received)
    return (int(match.group(1)) if match else "closed without an answer"), took


@dataclass
class BadInput:
    name: str
    outcome: int | str
    took_s: float
    served_after: int | None  # a good request's status right after

    def ok(self, closing_allowed: bool) -> bool:
        refused = isinstance(self.outcome, int) and 400 <= self.outcome < 500
        return (refused or (closing_allowed and self.outcome == "closed without an answer")) \
            and self.served_after == 200


def bad_inputs(base_url: str, address: tuple[str, int]) -> list[tuple[BadInput, bool]]:
    """Each bad input sent raw, then a good request: (what happened, whether that is as it must be)."""
    results = []
    for name, (data, closing_allowed) in bad_input_requests().items():
        outcome, took = exchange(address, data)
        result = BadInput(name, outcome, took, good_request(base_url))
        results.append((result, result.ok(closing_allowed)))
    return results


def check_records(out: Path, ended: int, answered: list[str]) -> list[str]:
    """What is wrong with a stopped server's requests.jsonl and summary.json (nothing: [])."""
    problems = []
    served = ServedRunLayout(Path(out))
    records = read_records(served.requests)
    ids = Counter(r.id for r in records)
    twice = [i for i, n in ids.items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} ids twice in requests.jsonl, e.g. {twice[0]}")
    if len(records) != ended:
        problems.append(f"requests.jsonl has {len(records)} lines, /metrics counted {ended} requests ended")
    ok = {r.id for r in records if r.ok}
    missing = [i for i in answered if i not in ok]
    if missing:
        problems.append(f"{len(missing)} completions answered 200 are not 'ok' in requests.jsonl, e.g. {missing[0]}")
    if not served.served_summary.exists():
        problems.append("no summary.json")
    return problems
