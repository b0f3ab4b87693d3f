"""The benchmarks' logic (docs/layout.md): `engine` (scripts/bench_engine.py), `serving` (scripts/bench_serving.py),
`peers` (the vLLM peer: output agreement, tune_vllm's schedule, bench_vllm_serve's servers and client), `load_client` /
`load_http` / `http_overhead` (scripts/load_http.py: `rakv serve --http` under load, and over HTTP vs trace replay).
The scripts parse arguments and print. It imports the runtime and serving, never the experiments.
"""
