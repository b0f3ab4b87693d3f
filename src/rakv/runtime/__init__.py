"""The runtime: what serves one request (docs/layout.md). Models and kernels, the prefix K/V store, decode
loops and proposers, the engine, the cost model, calibration and controller, and `strategies.run_strategy`, the one
typed path from a strategy name to a result. It imports nothing from rakv.serving or rakv.experiments.
"""
