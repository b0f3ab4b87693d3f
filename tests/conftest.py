import pytest


@pytest.fixture(scope="session")
def tiny_pair():
    from rakv.runtime.models import load_pair

    return load_pair("tiny", threads=2)


@pytest.fixture(scope="session")
def smollm2_pair():
    from rakv.runtime.models import load_pair

    return load_pair("smollm2", threads=2)
