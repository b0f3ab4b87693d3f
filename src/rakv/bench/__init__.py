"""The benchmarks as a library: typed options in, typed reports out, each goal once as data (`goals.judge`); the
scripts (scripts/bench_*.py and the HTTP checks) parse flags and print. Its modules are listed once, in
docs/layout.md's generated map. It imports the runtime and serving, never the experiments (tests/test_config.py).
"""
