"""Run state through Orbax: round trip in one run, onto another mesh, and the errors."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch
from cstorch.storage import load_orbax, save_orbax, save_tree_orbax
from tests.conftest import ROOT
from tests.models import classifier_step


def _run(width=16, layers=1, seed=0):
    torch.manual_seed(seed)
    backend = cstorch.backend("CPU")
    mods = [nn.Linear(6, width), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*mods, nn.Linear(width, 3))
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    step = classifier_step(compiled, optimizer)

    return backend, model, optimizer, step


def _batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def _snapshot(model, optimizer):
    out = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, (_p, st) in enumerate(optimizer.state.items()):
        out[f"opt.{i}"] = st["momentum_buffer"].detach().clone()
    return out


def test_trained_state_round_trips_and_training_continues_identically(tmp_path):
    backend, model, optimizer, step = _run()
    for i in range(2):
        step(*_batch(i))
    path = save_orbax(tmp_path / "ckpt")
    saved = _snapshot(model, optimizer)
    later = [float(step(*_batch(i))) for i in (2, 3)]
    final = _snapshot(model, optimizer)

    with torch.no_grad():
        model[0].weight.add_(1.0)  # a torch-side edit the restore must override
    info = load_orbax(path)
    assert info["step_count"] == 2 and backend.step_count == 2
    restored = _snapshot(model, optimizer)
    for k in saved:
        assert torch.equal(saved[k], restored[k]), k
    again = [float(step(*_batch(i))) for i in (2, 3)]
    assert again == later
    for k, v in _snapshot(model, optimizer).items():
        assert torch.equal(v, final[k]), k


def test_cstorch_load_reads_run_state_as_torch_tensors(tmp_path):
    backend, model, optimizer, step = _run()
    step(*_batch(0))
    save_orbax(tmp_path / "ckpt")
    loaded = cstorch.load(str(tmp_path / "ckpt"))
    assert loaded["step_count"] == 1
    assert list(loaded["state"])[:2] == ["model.0.weight", "model.0.bias"]
    assert torch.equal(loaded["state"]["model.0.weight"], model[0].weight.detach())
    assert "optimizer.state.0.momentum_buffer" in loaded["state"]


def test_a_run_that_has_not_stepped_loads_a_trained_checkpoint(tmp_path):
    _, model, optimizer, step = _run()
    step(*_batch(0))
    save_orbax(tmp_path / "ckpt")
    saved = _snapshot(model, optimizer)
    _, model2, optimizer2, _ = _run(seed=5)
    load_orbax(tmp_path / "ckpt")
    for k, v in _snapshot(model2, optimizer2).items():
        assert torch.equal(v, saved[k]), k


def test_errors(tmp_path):
    # Each run is kept while it is checked: the state of a model no one holds is dropped.
    _kept = _run()
    with pytest.raises(RuntimeError, match="does not exist"):
        load_orbax(tmp_path / "missing")
    with pytest.raises(RuntimeError, match="does not exist"):
        cstorch.load(str(tmp_path / "missing"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(RuntimeError, match="not an Orbax checkpoint"):
        load_orbax(tmp_path / "plain")
    with pytest.raises(RuntimeError, match="directory"):
        cstorch.load(str(tmp_path / "plain"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_orbax(tmp_path / "no" / "such" / "dir")

    save_orbax(tmp_path / "ckpt")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_orbax(tmp_path / "ckpt")
    save_orbax(tmp_path / "ckpt", overwrite=True)

    _kept = _run(layers=2)  # one more Linear: slots the checkpoint lacks
    with pytest.raises(ValueError, match=r"run has state the checkpoint lacks: model\.4\.weight"):
        load_orbax(tmp_path / "ckpt")
    save_orbax(tmp_path / "deeper")
    _kept = _run()  # and the other way round
    with pytest.raises(ValueError, match=r"checkpoint has state the run lacks: .*model\.4\.weight"):
        load_orbax(tmp_path / "deeper")

    _kept = _run(width=8)
    with pytest.raises(ValueError, match=r"'model\.0\.weight' has shape \(16, 6\) in the checkpoint "
                                         r"but \(8, 6\)"):
        load_orbax(tmp_path / "ckpt")

    save_tree_orbax({"a": torch.ones(2)}, tmp_path / "tree")
    with pytest.raises(ValueError, match="does not hold run state"):
        load_orbax(tmp_path / "tree")


def test_foreign_orbax_checkpoint_is_read_by_cstorch_load(tmp_path):
    import numpy as np
    import orbax.checkpoint as ocp
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(str(tmp_path / "std"), {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                                       "sub": {"b": np.ones(2, np.int32)}})
    ckptr.wait_until_finished()
    loaded = cstorch.load(str(tmp_path / "std"))
    assert torch.equal(loaded["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(loaded["sub"]["b"], torch.ones(2, dtype=torch.int32))


SAVE = r"""
import json, sys
import torch, torch.nn as nn, torch.nn.functional as F
import cerebras.pytorch as cstorch
from types import SimpleNamespace

role, path, systems = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0 if role == "save" else 7)
backend = cstorch.backend("CSX", artifact_dir=path + ".logs",
                          cluster_config=SimpleNamespace(num_csx=systems))
model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))
compiled = cstorch.compile(model, backend)
optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

@cstorch.trace
def step(x, y):
    loss = F.cross_entropy(compiled(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss

def batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 6, generator=g), torch.randint(0, 4, (8,), generator=g)

if role == "save":
    for i in range(2):
        step(*batch(i))
    cstorch.storage.save_orbax(path)
else:
    cstorch.storage.load_orbax(path)
state = backend.state
values = {name: state.tensor(name).detach().tolist() for name in state.names}
meshes = [dict(a.sharding.mesh.shape) for a in state.arrays().values()]
loss = float(step(*batch(2)))
print(json.dumps({"mesh": dict(backend.mesh.shape), "values": values, "loss": loss,
                  "step_count": backend.step_count, "meshes": meshes}))
"""


def _script(role, path, devices, systems=1):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", SAVE, role, str(path), str(systems)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_restore_onto_a_different_mesh(tmp_path):
    path = tmp_path / "wafer"
    saved = _script("save", path, 8)
    assert saved["mesh"] == {"systems": 1, "rows": 2, "cols": 4}
    for devices, systems, mesh in ((8, 2, {"systems": 2, "rows": 2, "cols": 2}),
                                   (4, 1, {"systems": 1, "rows": 2, "cols": 2})):
        restored = _script("load", path, devices, systems)
        assert restored["mesh"] == mesh
        assert all(m == mesh for m in restored["meshes"])  # read onto the new mesh
        assert restored["values"].keys() == saved["values"].keys()
        assert restored["values"] == saved["values"]
        assert restored["step_count"] == 3 and saved["step_count"] == 3
        assert abs(restored["loss"] - saved["loss"]) <= 1e-5 * abs(saved["loss"])
