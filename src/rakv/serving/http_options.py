"""What one client may ask of `rakv serve --http`: the server's limits, as flags (defaults: conf/serving/default.yaml's
`http` node, the one source of their values) and the bounds of a request's fields (rakv.serving.protocol).

A light module on purpose: the CLI builds its flags from it without importing the web stack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from rakv.runtime.errors import RakvError
from rakv.runtime.paths import conf_file

MIN_TEMPERATURE = 1e-5  # 0 is greedy; below this, logits / T overflows float32 (softmax NaN): refused
MAX_TEMPERATURE = 100.0  # above this the distribution is uniform to float32 precision: refused as a likely mistake
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes
RETRY_AFTER_S = 1  # the Retry-After of a 429 / 503
API_KEY_ENV = "RAKV_API_KEY"  # the key when --api-key is not given (as vLLM's VLLM_API_KEY)


@dataclass(frozen=True)
class HttpOptions:
    """The HTTP server's limits. Each field is `rakv serve`'s flag of the same name (rakv.runtime.flags)."""

    max_body_mib: float = field(metadata={"metavar": "MIB", "help": "a request body larger than this is refused 413"})
    max_waiting: int = field(metadata={"metavar": "N", "help": (
        "requests queued beyond the running ones; beyond that a request is refused 429 with Retry-After")})
    max_connections: int = field(metadata={"metavar": "N", "help": "open connections at most; beyond that 503"})
    idle_timeout_s: float = field(metadata={"metavar": "S", "help": (
        "a kept-alive connection that sends nothing for this long after an answer is closed")})
    read_timeout_s: float = field(metadata={"metavar": "S", "help": (
        "a request's head (from connecting, or from the previous answer) and its body must each arrive within this; "
        "else the connection is closed (a body: 408)")})
    drain_s: float = field(metadata={"metavar": "S", "help": (
        "on SIGTERM or Ctrl-C, running requests get this long to finish while new ones get 503")})
    api_key: str | None = field(default=None, metadata={"metavar": "KEY", "help": (
        f"as vLLM's flag: every /v1 route needs the header 'Authorization: Bearer KEY' (else 401); /health, /metrics, "
        f"/tokenize, /detokenize and /version stay open. Default: ${API_KEY_ENV} if set, else no key")})

    def __post_init__(self):
        if self.api_key is not None and not self.api_key.strip():
            raise RakvError("--api-key must not be empty")
        for spec in fields(self):
            if spec.name != "api_key" and not getattr(self, spec.name) > 0:
                raise RakvError(f"--{spec.name.replace('_', '-')} must be positive, got {getattr(self, spec.name)}")

    @property
    def key(self) -> str | None:
        """The key requests must bear: --api-key, else $RAKV_API_KEY, else none."""
        return self.api_key or os.environ.get(API_KEY_ENV) or None

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mib * (1 << 20))

    @classmethod
    def default(cls, **overrides) -> HttpOptions:
        return cls(**{**conf_defaults(), **overrides})


def conf_defaults() -> dict:
    """conf/serving/default.yaml's `http` node: the flags' defaults."""
    return dict(conf_file("serving/default.yaml").http)


HTTP_FLAGS = tuple(f.name for f in fields(HttpOptions))
