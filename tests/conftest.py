import os

import pytest
import torch

# pytest-xdist's workers (scripts/test.sh: one per core) share the machine: each computes on one thread. Two workers
# on two cores at the pairs' two threads each ran four threads on two cores, which doubled the suite's time (the
# kernels' results do not depend on the thread count: threads split output panels, never a sum).
THREADS = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


@pytest.fixture(autouse=True)
def _threads():
    """Each test starts at THREADS, whatever an earlier test of this worker loaded a model with."""
    torch.set_num_threads(THREADS)


@pytest.fixture(scope="session")
def tiny_pair():
    from rakv.runtime.models import load_pair

    return load_pair("tiny", threads=THREADS)


@pytest.fixture(scope="session")
def smollm2_pair():
    from rakv.runtime.models import load_pair

    return load_pair("smollm2", threads=THREADS)


# The files whose tests take longest (a pipeline fixture, studies and stages run as subprocesses; `pytest
# --durations`), longest first. scripts/test.sh keeps a file on one worker (--dist loadfile) and hands files out in
# collection order: collected in alphabetical order, the longest file started when the other worker was near its end
# and ran on alone. Collected first, they start at once and the short files fill in around them.
LONGEST_FIRST = ("test_smoke_outputs.py", "test_study.py", "test_reproduce_jobs.py", "test_serving_study.py",
                 "test_sampling_engine.py", "test_all_proposers.py", "test_sharding_stages.py", "test_kernels.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: every other file keeps its order
