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
