"""The benchmarks as a library (docs/layout.md): typed options in, typed reports out, each goal once as data.

- `options`: each benchmark's options as a frozen dataclass, the scripts' flags generated from its fields;
- `records`: the reports' JSON form (`to_json`, `load_record`: one line naming a missing or unknown field);
- `goals`: every goal the benchmarks judge (name, measure, threshold, direction) and `judge`, the one function
  that judges them and whose verdicts the scripts print;
- `engine` (scripts/bench_engine.py; `engine_report` its report, `engine_load` its fresh processes for memory and
  start-up, `llama_cpp` the llama.cpp peer), `serving` (scripts/bench_serving.py), `roofline` (floors and bounds),
  `kernel_ab` (scripts/ab_kernels.py);
- the vLLM peer: `peer_reports` (the records of what bench_serving.py --out, bench_vllm_serve.py and tune_vllm.py
  write, and of scripts/vllm_peer.py's jobs and answers), `peers` (output agreement, the job files, tune_vllm's step
  model and schedule), `vllm_serve` (bench_vllm_serve.py's servers and client);
- `load_client` / `load_http` / `http_overhead` (scripts/load_http.py: `rakv serve --http` under load, and over
  HTTP vs trace replay), `fuzz_http` (scripts/fuzz_http.py).
The scripts parse flags and print. It imports the runtime and serving, never the experiments (which read the
shipped peer reports through `peer_reports`).
"""
