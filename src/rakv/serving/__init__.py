"""Serving: several requests in flight through one engine (README: "Serving").

    trace.py      the trace format (read and validated whole before any model work) and its generator
    request.py    a served request: its tokens, how many are computed, its state and timings (no tensors)
    scheduler.py  one iteration's plan under a token budget and a K/V byte budget (no tensors)
    runner.py     runs a plan: the batched proposer and target forwards, acceptance, per-request rollback
    server.py     the loop (arrivals, schedule, run, apply), requests.jsonl and summary.json
    metrics.py    summary.json's statistics, under vLLM benchmark_serving's names
    policies.py   speculation under load: k per decoding request (per-request, disable-by-batch-size, k-by-batch)
    replay.py     each finished request generated alone: the reference a served trace is held to

The import rule of the layers: serving imports the runtime (rakv.runtime.engine, .decoding, .proposers, .cache,
...), never the experiments (rakv.experiments); the runtime never imports serving (tests/test_config.py).
"""
