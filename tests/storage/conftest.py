import os

import pytest

from tests.conftest import SHARED

FIXTURES = os.path.join(SHARED, "fixtures", "checkpoints")


@pytest.fixture
def fixtures_dir():
    assert os.path.isdir(FIXTURES), f"the real checkpoint fixtures must be at {FIXTURES}"
    return FIXTURES


@pytest.fixture(autouse=True)
def _clean_state():
    from cstorch.backends import csx
    from cstorch.storage import retention
    compress = csx.performance.compress_weights
    retention.forget()
    yield
    csx.performance.compress_weights = compress
    retention.forget()
