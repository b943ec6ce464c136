"""compile_only, validate_only, drop_data and compile_dir: the CSX flags that decide what
a run does with its state and its compiled programs."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from jax import monitoring

import cerebras.pytorch as cstorch
import wafer
from cerebras.pytorch.utils.data import DataExecutor, DataLoader
from tests.models import classifier_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_xla_compiles = [0]
monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: _xla_compiles.__setitem__(0, _xla_compiles[0] + 1)
    if event == "/jax/core/compile/backend_compile_duration" else None)


def _run(backend, steps=3):
    """A model, SGD with momentum, a step with a value-reading closure, run by an executor."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    seen = []

    @cstorch.step_closure
    def log(loss):
        seen.append(float(loss))

    @cstorch.step_closure
    def mark():
        seen.append("mark")

    @cstorch.trace
    def step(x, y):
        loss = F.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log(loss)
        mark()
        return loss

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, 4, generator=g), torch.randint(0, 2, (4,), generator=g))
            for _ in range(steps)]
    outs = [step(x, y) for x, y in DataExecutor(DataLoader(lambda: data))]
    return model, optimizer, initial, outs, seen, step


@pytest.mark.parametrize("mode", ["compile_only", "validate_only"])
def test_compile_and_validate_only_run_nothing(mode, tmp_path, capsys):
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path), **{mode: True})
    requested, compiles = wafer.compile_stats.requested, _xla_compiles[0]
    model, optimizer, initial, outs, seen, step = _run(backend)
    assert len(outs) == 1 and step.captures == 1       # one step, as the reference says
    # nothing was executed: every weight is exactly as initialised, no value was computed
    for name, value in model.state_dict().items():
        assert torch.equal(value, initial[name]), name
    assert backend.state.absent() == backend.state.names   # nothing was put on the device
    with pytest.raises(RuntimeError, match=f"no value: the backend is {mode}"):
        float(outs[0])
    # the closure that reads a value is skipped with a one-line notice; the other runs
    assert seen == ["mark"]
    assert f"{mode}: step closure" in capsys.readouterr().err
    files = set(os.listdir(tmp_path))
    assert {"step.jaxpr.txt", "step.stablehlo.mlir"} <= files
    if mode == "compile_only":
        assert {"step.hlo.txt", "step.analysis.json"} <= files
        assert wafer.compile_stats.requested == requested + 1
    else:   # validate_only: lowered, never compiled
        assert not {"step.hlo.txt", "step.analysis.json"} & files
        assert wafer.compile_stats.requested == requested
        assert _xla_compiles[0] == compiles
    cstorch.backend("CPU")


@pytest.fixture
def float32_csx():
    # compared with a CPU run below: the CSX backend computes exact float32 at POL 0
    cstorch.backends.csx.precision.optimization_level = 0
    yield
    cstorch.backends.csx.precision.reset()


def test_drop_data_needs_a_checkpoint_and_then_trains_like_the_saved_run(tmp_path, float32_csx):
    reference, ref_opt, _, _, _, ref_step = _run(cstorch.backend("CPU"), steps=2)
    path = str(tmp_path / "ckpt.mdl")
    cstorch.save({"model": reference.state_dict(), "optimizer": ref_opt.state_dict()}, path)
    x, y = torch.randn(4, 4), torch.randint(0, 2, (4,))
    expected = float(ref_step(x, y))      # the saved run, one step further
    expected_state = {k: v.clone() for k, v in reference.state_dict().items()}

    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path / "logs"), drop_data=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    step = classifier_step(compiled, optimizer)

    with pytest.raises(RuntimeError, match="drop_data=True.*no value: model.0.weight, model.0.bias"):
        step(x, y)
    with pytest.raises(RuntimeError, match="drop_data=True"):
        model[0].weight.sum()
    state = cstorch.load(path)
    model.load_state_dict(state["model"])
    with pytest.raises(RuntimeError, match="no value: optimizer.state.0.momentum_buffer"):
        step(x, y)
    optimizer.load_state_dict(state["optimizer"])
    assert backend.state.absent() == []
    assert float(step(x, y)) == pytest.approx(expected, rel=1e-6)
    for name, value in model.state_dict().items():
        assert torch.allclose(value, expected_state[name], rtol=1e-5, atol=1e-7), name
    cstorch.backend("CPU")


_SECOND_PROCESS = r"""
import json, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
import cerebras.pytorch as cstorch
import wafer
backend = cstorch.backend("CSX", compile_dir=sys.argv[1], artifact_dir=sys.argv[1] + ".logs")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))
compiled = cstorch.compile(model, backend)
optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)

@cstorch.trace
def step(x, y):
    loss = F.cross_entropy(compiled(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss

g = torch.Generator().manual_seed(1)
x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
start = time.perf_counter()
loss = float(step(x, y))
print(json.dumps({"first_step_s": time.perf_counter() - start, "loss": loss,
                  "requested": wafer.compile_stats.requested, "compiled": wafer.compile_stats.compiled}))
"""


def test_a_second_process_with_the_same_compile_dir_compiles_nothing(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}

    def run():
        proc = subprocess.run([sys.executable, "-c", _SECOND_PROCESS, str(tmp_path / "cache")],
                              env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold, warm = run(), run()
    assert cold["requested"] == 1 and cold["compiled"] == 1
    # the stored program is taken from compile_dir: XLA is not even asked (warm start)
    assert warm["requested"] == 0 and warm["compiled"] == 0
    assert warm["loss"] == cold["loss"]
    assert os.listdir(tmp_path / "cache")
