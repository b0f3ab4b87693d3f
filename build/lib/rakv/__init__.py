"""RAKV-ASD: cross-request prefix KV reuse and adaptive speculative decoding under a measured cost model."""

__version__ = "0.1.0"
