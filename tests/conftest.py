import os
import sys

# Tests that need several JAX devices on this CPU run in a subprocess that sets XLA_FLAGS
# itself; the main test process uses one CPU device.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# transformers models are built from configs in the tests; nothing is downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)
