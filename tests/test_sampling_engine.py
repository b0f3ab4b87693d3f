"""Sampled speculative decoding follows AR sampling's distribution at positions after rejections (tiny pair).

A two-sample chi-square test per position: the marginal distribution of the token at that position
over many seeds, AR sampling against speculative sampling with a draft model (k = 4), temperature and
top-p applied. The same test between the target and its draft (different models) must reject, which
shows the sample is large enough to see a wrong sampler.
"""

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from rakv.runtime.actions import Action
from rakv.runtime.cache import PrefixKVStore
from rakv.runtime.decoding import Sampling
from rakv.runtime.engine import Engine

pytestmark = pytest.mark.heavy  # 300 runs per arm and position: about a minute on 2 cores
RUNS = 300
NEW_TOKENS = 5
POSITIONS = (2, 3, 4)  # the first token comes from the prefill; these follow at least one speculative round
SAMPLING = dict(temperature=0.25, top_p=0.95)


def samples(engine, action, runs=RUNS, seed0=0):
    ids = engine.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    out, rejected_before = [], []
    for seed in range(seed0, seed0 + runs):
        result = engine.run(ids, action, NEW_TOKENS, sampling=Sampling(seed=seed, **SAMPLING), ignore_eos=True)
        out.append(result.token_ids)
        # tokens confirmed before the first rejection: a position past it was sampled after a rejection
        confirmed, first_rejection = 1, None
        for proposed, accepted in result.round_log:
            if accepted < proposed and first_rejection is None:
                first_rejection = confirmed + accepted
            confirmed += accepted + 1
        rejected_before.append(first_rejection)
    return np.array(out), rejected_before


def two_sample_pvalue(a: np.ndarray, b: np.ndarray, min_count: int = 10) -> float:
    """Chi-square test of homogeneity over tokens, pooling tokens rarer than `min_count` into one cell."""
    tokens, counts = np.unique(np.concatenate([a, b]), return_counts=True)
    common = set(tokens[counts >= min_count].tolist())
    table = [[sum(t == c for t in sample) for c in common] + [sum(t not in common for t in sample)]
             for sample in (a.tolist(), b.tolist())]
    table = np.array(table)
    table = table[:, table.sum(axis=0) > 0]
    return chi2_contingency(table).pvalue


@pytest.fixture(scope="module")
def ar_and_spec(tiny_pair):
    engine = Engine(tiny_pair, PrefixKVStore(budget_bytes=1 << 30))
    ar, _ = samples(engine, Action(False, 0))
    spec, rejected_before = samples(engine, Action(False, 4), seed0=10_000)
    return ar, spec, rejected_before


@pytest.mark.parametrize("position", POSITIONS)
def test_speculative_sampling_matches_ar_after_rejections(ar_and_spec, position):
    ar, spec, rejected_before = ar_and_spec
    after_rejection = sum(r is not None and r <= position for r in rejected_before)
    assert after_rejection >= RUNS // 6, "too few runs reach this position after a rejection to test it"
    assert two_sample_pvalue(ar[:, position], spec[:, position]) > 0.001


def test_the_test_can_tell_the_draft_from_the_target(tiny_pair, ar_and_spec):
    draft_engine = Engine(type(tiny_pair)(tiny_pair.name, tiny_pair.draft, tiny_pair.draft, tiny_pair.tokenizer,
                                          tiny_pair.device), PrefixKVStore(budget_bytes=1 << 30))
    draft, _ = samples(draft_engine, Action(False, 0), seed0=20_000)
    ar = ar_and_spec[0]
    assert min(two_sample_pvalue(ar[:, p], draft[:, p]) for p in POSITIONS) < 1e-4
