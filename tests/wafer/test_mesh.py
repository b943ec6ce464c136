"""The CSX backend on an emulated wafer of 8 devices trains as the 1-device CPU backend."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = r"""
import json, sys
import torch
import jax
import cerebras.pytorch as cstorch
from examples.train_gpt import TinyGPT, next_token_loss, update

kind = sys.argv[1]
torch.manual_seed(0)
backend = cstorch.backend(kind, artifact_dir=sys.argv[2])
model = TinyGPT()
compiled = cstorch.compile(model, backend)
optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

@cstorch.trace
def step(tokens):
    loss = next_token_loss(compiled, tokens)
    update(loss, model.parameters(), optimizer)
    return loss

g = torch.Generator().manual_seed(1)
losses = [float(step(torch.randint(0, 61, (8, 17), generator=g))) for _ in range(4)]
program = next(iter(step.programs.values()))[0]
print(json.dumps({"losses": losses, "devices": len(backend.devices),
                  "mesh": dict(backend.mesh.shape),
                  "input_sharding": str(program.compiled.input_shardings[0].spec),
                  "qkv_sharding": str(backend.state.arrays()[
                      "model.blocks.0.attn.qkv.weight"].sharding.spec)}))
"""


def _run(kind, tmp_path, devices):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, kind, str(tmp_path / kind)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_csx_mesh_of_eight_devices_matches_one_cpu_device(tmp_path):
    csx = _run("CSX", tmp_path, 8)
    cpu = _run("CPU", tmp_path, 1)
    assert csx["devices"] == 8 and csx["mesh"] == {"systems": 1, "rows": 2, "cols": 4}
    assert "rows" in csx["input_sharding"]  # the batch is split across the wafer
    assert csx["qkv_sharding"] == "P('rows', 'cols')"  # a weight over the grid
    for a, b in zip(csx["losses"], cpu["losses"]):
        assert abs(a - b) <= 1e-4 * abs(b)
    assert os.path.exists(tmp_path / "CSX" / "step.stablehlo.mlir")
