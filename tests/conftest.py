import importlib
import os
import sys

import pytest

# Tests that need several JAX devices on this CPU run in a subprocess that sets XLA_FLAGS
# itself; the main test process uses one CPU device.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# transformers models are built from configs in the tests; nothing is downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)


@pytest.fixture(autouse=True, scope="session")
def _backends_replace_each_other():
    """A process refuses a second backend, as the reference does; the tests here are many
    runs in one process, and a test's new backend replaces the one an earlier test (or
    helper) made. Tests of the refusal set `_replacing_allowed` back to False."""
    module = importlib.import_module("cstorch.backend")  # the module, not the function
    module._replacing_allowed = True
    yield
    module._replacing_allowed = False


@pytest.fixture(autouse=True)
def _amp_settings_kept():
    """cstorch.amp's half dtype and mixed-precision switch are process-wide, as in the
    reference, where each run is a process of its own: a test that changes them (Model Zoo's
    precision callback does) must not change what the tests after it compute with (a
    float16 batch for a model not run under autocast)."""
    settings = importlib.import_module("cstorch.amp.half_dtype")._settings
    saved = dict(settings)
    yield
    settings.update(saved)
