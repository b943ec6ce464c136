"""What a run leaves in artifact_dir (the captured ATen graph beside the jaxpr, StableHLO,
optimised HLO and analyses), the state layout report, and log_initialization."""
import io
import json
import math
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
import wafer.compile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sgd_step(backend):
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def train_step(x, y):
        loss = F.mse_loss(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    return model, train_step


def test_a_compiled_step_leaves_its_graph_program_and_layout(tmp_path):
    backend = cstorch.backend("CPU", artifact_dir=str(tmp_path))
    _, train_step = _sgd_step(backend)
    loss = train_step(torch.randn(3, 5), torch.randn(3, 2))
    # Written while the step's first call runs; on disk once a value is read on the host.
    float(loss)
    names = set(os.listdir(tmp_path))
    assert {f"train_step.{ext}" for ext in ("aten.txt", "jaxpr.txt", "stablehlo.mlir", "hlo.txt",
                                             "analysis.json")} <= names
    assert "torch.ops.aten.addmm.default" in (tmp_path / "train_step.aten.txt").read_text()
    rows = json.loads((tmp_path / "layout.json").read_text())
    assert [r["name"] for r in rows] == ["model.0.weight", "model.0.bias", "model.2.weight",
                                         "model.2.bias"]
    assert rows[0]["shape"] == [7, 5] and rows[0]["bytes_per_device"] == 7 * 5 * 4
    assert "model.0.weight" in (tmp_path / "layout.txt").read_text()


def test_artifacts_are_complete_before_a_value_is_read(tmp_path, monkeypatch):
    # A writer held back until half a second after the call returned: the read waits
    # for it instead of finding half the files.
    write, release = wafer.compile._write, threading.Event()

    def held(*args):
        release.wait(timeout=60)
        write(*args)
    monkeypatch.setattr(wafer.compile, "_write", held)
    backend = cstorch.backend("CPU", artifact_dir=str(tmp_path))
    _, train_step = _sgd_step(backend)
    loss = train_step(torch.randn(3, 5), torch.randn(3, 2))
    assert not (tmp_path / "train_step.analysis.json").exists()   # still being written
    threading.Timer(0.5, release.set).start()
    float(loss)
    assert "dot_general" in (tmp_path / "train_step.jaxpr.txt").read_text()
    assert "stablehlo.dot_general" in (tmp_path / "train_step.stablehlo.mlir").read_text()
    assert "cost" in json.loads((tmp_path / "train_step.analysis.json").read_text())


def test_a_failed_artifact_write_is_raised_at_the_next_read_and_the_step_ran(tmp_path):
    backend = cstorch.backend("CPU", artifact_dir=str(tmp_path))
    model, train_step = _sgd_step(backend)
    (tmp_path / "train_step.jaxpr.txt").mkdir()   # a directory where the file goes
    before = model[0].weight.to("cpu").clone()
    loss = train_step(torch.randn(3, 5), torch.randn(3, 2))
    with pytest.raises(OSError, match=r"could not write the jaxpr, StableHLO and HLO of "
                                      r"train_step in .*IsADirectoryError.*The step itself ran"):
        float(loss)
    assert math.isfinite(float(loss))   # raised once; the step's results are there
    assert not torch.equal(model[0].weight.to("cpu"), before)   # and it updated the model


_MESH = r"""
import json, sys
import torch, torch.nn as nn
import cerebras.pytorch as cstorch
backend = cstorch.backend("CSX", artifact_dir=sys.argv[1])
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16), nn.LayerNorm(16))
cstorch.compile(model, backend)
optimizer = cstorch.optim.Adam(model.parameters(), lr=1e-3)
rows = backend.layout_report()
shards = {name: list(backend.state.tensor(name).cell.array.addressable_shards[0].data.shape)
          for name in backend.state.names}
print(json.dumps({"rows": rows, "shards": shards, "mesh": dict(backend.mesh.shape)}))
"""


def test_large_matrices_take_an_eighth_per_device_on_a_2x4_mesh(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", _MESH, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["mesh"] == {"systems": 1, "rows": 2, "cols": 4}
    rows = {r["name"]: r for r in out["rows"]}
    for name in ("model.0.weight", "model.2.weight", "optimizer.state.0.exp_avg",
                 "optimizer.state.2.exp_avg_sq"):
        row = rows[name]
        assert row["bytes_per_device"] * 8 == row["bytes_replicated"], name
        # the report says what the device arrays hold
        assert out["shards"][name] == list(row["shard_shape"]), name
    assert rows["model.3.weight"]["bytes_per_device"] == rows["model.3.weight"]["bytes_replicated"]
    printed = proc.stdout
    assert "state layout on mesh systems=1 x rows=2 x cols=4 (8 devices)" in printed
    assert (tmp_path / "layout.txt").read_text().strip() in printed


def test_log_initialization_shows_progress_on_a_terminal(monkeypatch, tmp_path):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for flag, shown in ((True, True), (False, False)):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        backend = cstorch.backend("CSX", artifact_dir=str(tmp_path), log_initialization=flag)
        cstorch.compile(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), backend)
        text = terminal.getvalue()
        assert ("initializing" in text and "4/4" in text) is shown
        assert ("initialized Sequential (4 tensors)" in text) is shown
    cstorch.backend("CPU")
