"""Serving: several requests in flight through one engine (docs/serving.md).

Its modules are described once, in docs/layout.md's generated map, and its
speculation policies once, in rakv.serving.policies (the module's docstring; `speculation_policy` parses every name).
The import rule of the layers: serving imports the runtime (rakv.runtime.engine, .decoding, .proposers, .cache, ...),
never the experiments (rakv.experiments); the runtime never imports serving (tests/test_config.py).
"""
