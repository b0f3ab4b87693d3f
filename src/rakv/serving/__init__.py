"""Serving: several requests in flight through one engine (docs/serving.md).

    trace.py      the trace format (read and validated whole before any model work) and its generator
    request.py    a served request: its tokens, how many are computed, its state and timings (no tensors)
    scheduler.py  schedule() -> Step under a token budget and a K/V byte budget; update_from_output() applies it
    admission.py  a request's action, chosen once at its first admission attempt with the store's answer
    acceptance.py a request's acceptance estimate at admission, and learning from finished requests' rounds
    kv.py         the K/V manager: every running request's caches, the prefix store's lookups and inserts
    executor.py   execute(step) -> StepOutput: batched proposals and target forward, acceptance, rollback
    server.py     ServeOptions (each field also a flag), ServeParts, EngineCore (the engine's one set-up and step,
                  for trace replay and HTTP), the trace-replay loop serve(), summary.json
    records.py    RequestRecord: a served request's requests.jsonl line, typed; its fsynced writer
    engine_loop.py  rakv serve --http's engine thread: the scheduler's one owner, guarded (a fault fails its requests
                  alone; an engine that cannot go on answers 503), the bounded queue, the drain
    protocol.py   the OpenAI-compatible API's bodies as pydantic models: every field typed and bounded
    http.py       rakv serve --http's app: the FastAPI routes, the body limits, SSE streaming, the error shape
    http_server.py  its process: uvicorn with a head timeout, the socket, the drain, make_server / serve_http
    http_options.py  the HTTP server's limits (flags; conf/serving/default.yaml) and the fields' bounds
    prometheus.py GET /metrics: Prometheus metrics under vLLM's names
    metrics.py    summary.json's statistics, under vLLM benchmark_serving's names
    policies.py   speculation under load: k per decoding request (per-request, disable-by-batch-size, k-by-batch)
    batchcost.py  the batch cost model: what one iteration costs, measured on this machine
    replay.py     each finished request generated alone: the reference a served trace is held to

The import rule of the layers: serving imports the runtime (rakv.runtime.engine, .decoding, .proposers, .cache,
...), never the experiments (rakv.experiments); the runtime never imports serving (tests/test_config.py).
"""
