"""torchvision imports even where its C++ operator library cannot load (PyPI's Linux wheels
link torch's CUDA libraries; a CPU-only torch has none), whatever was imported first: its
transforms work, its operators raise torchvision's own error, and a warning says so
(`cstorch_torchvision`, a plugin torch loads when imported, and called by cstorch again).
Each case runs in a fresh process, since torchvision is imported once per process."""
import ctypes
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

torchvision_spec = importlib.util.find_spec("torchvision")

FIRST = {
    "cstorch": "import cerebras.pytorch",
    "torchvision": "import torchvision",
    # every transformers model module imports torchvision (through image_utils)
    "transformers": "from transformers import BertForSequenceClassification",
}
SCRIPT = r"""
import numpy as np, PIL.Image, torch, torchvision
from torchvision import transforms
image = PIL.Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), np.uint8))
out = transforms.Compose([transforms.CenterCrop(16), transforms.ToTensor()])(image)
expected = torch.from_numpy(np.asarray(image)[8:24, 8:24]).permute(2, 0, 1).float() / 255
assert torch.equal(out, expected), "the transform's values"
try:
    kept = torchvision.ops.nms(torch.tensor([[0., 0, 2, 2], [0, 0, 2, 2.1]]),
                               torch.tensor([0.9, 0.8]), 0.5)
    print("nms", kept.tolist())
except RuntimeError as e:
    print("nms raised:", str(e).splitlines()[0])
"""


def _operator_library_loads():
    directory = torchvision_spec.submodule_search_locations[0]
    path = next(os.path.join(directory, f) for f in os.listdir(directory)
                if f.startswith("_C.") and f.endswith(".so"))
    import torch  # noqa: F401  (the library links torch's own)
    try:
        ctypes.CDLL(path)
        return True
    except OSError:
        return False


@pytest.mark.parametrize("first,plugins", [
    ("cstorch", "1"), ("torchvision", "1"), ("transformers", "1"),
    ("cstorch", "0"),     # torch's plugins switched off: cstorch's own call
])
def test_torchvision_imports_with_or_without_its_operators(first, plugins):
    assert torchvision_spec is not None, "the modelzoo extra installs torchvision"
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": plugins}
    proc = subprocess.run([sys.executable, "-c", FIRST[first] + "\n" + SCRIPT],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if _operator_library_loads():
        assert "nms [0]" in proc.stdout
        assert "torchvision's C++ operators" not in proc.stderr
    else:
        assert "nms raised: Couldn't load custom C++ ops" in proc.stdout
        assert "UserWarning: torchvision's C++ operators do not load with this torch" \
            in proc.stderr
