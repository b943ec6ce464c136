"""Warm start (cstorch/tracing/warm.py): with a `compile_dir`, a new process takes the step's
stored program without capturing the step, and computes what the first process computed;
whatever the program depends on that changed in between (the model's source, a Python
value the step reads, a library's version) makes it capture the step again; a damaged
entry warns and is captured again. Each process is a fresh subprocess."""
import glob
import json
import os
import subprocess
import sys

import pytest
import torch

import cerebras.pytorch as cstorch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODEL = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)
        self.scale = scale

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)) * self.scale)
'''

SCRIPT = r'''
import json, os, sys
import torch
import torch.nn.functional as F
if os.environ.get("FAKE_TORCH_VERSION"):
    torch.__version__ = os.environ["FAKE_TORCH_VERSION"]
import cerebras.pytorch as cstorch
from warm_model import Net

backend = cstorch.backend("CSX", compile_dir=sys.argv[1])
cstorch.backends.csx.precision.optimization_level = 0   # float32 matmuls, as eager
torch.manual_seed(0)
model = Net(float(os.environ.get("SCALE", "1.0")))
compiled = cstorch.compile(model, backend)
optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
seen = []


@cstorch.step_closure
def keep(loss):
    seen.append(float(loss))


@cstorch.trace
def step(x, y):
    loss = F.cross_entropy(compiled(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if os.environ.get("CLOSURE"):
        keep(loss)
    return loss


gen = torch.Generator().manual_seed(1)
losses = []
for _ in range(3):
    x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
    losses.append(float(step(x, y)))
stacked = sum(type(s) is tuple for ps in step.programs.values() for p in ps for s in p.slots or ())
print(json.dumps({"captures": step.captures, "warm": step.warm_starts, "losses": losses,
                  "stacked": stacked,
                  "weights": {k: v.tolist() for k, v in model.state_dict().items()}}))
'''


def _run(tmp_path, script=SCRIPT, **env_extra):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
           **env_extra}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "compile_dir")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def _model_file(tmp_path, source=MODEL):
    (tmp_path / "warm_model.py").write_text(source)


def _entries(tmp_path):
    return glob.glob(str(tmp_path / "compile_dir" / "cstorch-steps" / "*.pkl"))


def _eager(scale, times_two=False):
    """The same three steps in eager PyTorch, computed here."""
    torch.manual_seed(0)
    fc1, fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)
    params = list(fc1.parameters()) + list(fc2.parameters())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        h = torch.tanh(fc1(x)) * scale
        loss = torch.nn.functional.cross_entropy(fc2(h * 2 if times_two else h), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _close(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-4 * abs(b), (ours, theirs)


def test_an_unchanged_script_takes_the_stored_program(tmp_path):
    _model_file(tmp_path)
    cold, _ = _run(tmp_path)
    assert (cold["captures"], cold["warm"]) == (1, 0)
    assert len(_entries(tmp_path)) == 1
    warm, _ = _run(tmp_path)
    assert (warm["captures"], warm["warm"]) == (0, 1)   # no capture in the second process
    assert warm["losses"] == cold["losses"] and warm["weights"] == cold["weights"]
    _close(warm["losses"], _eager(1.0))


def test_a_stored_program_holding_looped_layers_state_stacked(tmp_path):
    # With scan_blocks, the program takes the layers' parameters and moments stacked
    # (`cstorch.tracing.state_slots`): the stored program keeps that layout.
    script = SCRIPT.replace(
        "model = Net(", "cstorch.backends.csx.performance.scan_blocks = True\nmodel = Net(")
    source = MODEL.replace("self.fc1 = nn.Linear(8, 16)", "self.fc1 = nn.Linear(8, 16)\n"
                           "        self.blocks = nn.Sequential(*[nn.Linear(16, 16) for _ in range(3)])")
    source = source.replace("torch.tanh(self.fc1(x))", "self.blocks(torch.tanh(self.fc1(x)))")
    _model_file(tmp_path, source)
    cold, _ = _run(tmp_path, script)
    warm, _ = _run(tmp_path, script)
    assert (cold["captures"], cold["warm"], warm["captures"], warm["warm"]) == (1, 0, 0, 1)
    assert cold["stacked"] >= 4 and warm["stacked"] == cold["stacked"]   # weights, biases, momenta
    assert warm["losses"] == cold["losses"] and warm["weights"] == cold["weights"]
    torch.manual_seed(0)
    fc1, blocks, fc2 = (torch.nn.Linear(8, 16),
                        torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)]),
                        torch.nn.Linear(16, 3))
    params = [*fc1.parameters(), *blocks.parameters(), *fc2.parameters()]
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        loss = torch.nn.functional.cross_entropy(fc2(blocks(torch.tanh(fc1(x)))), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    _close(warm["losses"], losses)


@pytest.mark.slow
def test_an_edited_model_source_is_captured_again(tmp_path):
    _model_file(tmp_path)
    cold, _ = _run(tmp_path)
    _model_file(tmp_path, MODEL.replace("* self.scale)", "* self.scale * 2)"))
    edited, _ = _run(tmp_path)
    assert (edited["captures"], edited["warm"]) == (1, 0)
    _close(edited["losses"], _eager(1.0, times_two=True))
    assert edited["losses"] != cold["losses"]


@pytest.mark.slow
def test_a_changed_watched_value_is_captured_again(tmp_path):
    _model_file(tmp_path)
    _run(tmp_path, SCALE="1.0")
    other, _ = _run(tmp_path, SCALE="0.5")
    assert (other["captures"], other["warm"]) == (1, 0)
    _close(other["losses"], _eager(0.5))
    again, _ = _run(tmp_path, SCALE="0.5")   # each value's program is kept
    assert (again["captures"], again["warm"]) == (0, 1)
    assert again["losses"] == other["losses"]


@pytest.mark.slow
def test_another_torch_version_is_captured_again(tmp_path):
    _model_file(tmp_path)
    _run(tmp_path)
    other, _ = _run(tmp_path, FAKE_TORCH_VERSION="0.0.1+another")
    assert (other["captures"], other["warm"]) == (1, 0)


@pytest.mark.slow
def test_a_damaged_entry_warns_and_is_captured_again(tmp_path):
    _model_file(tmp_path)
    cold, _ = _run(tmp_path)
    for path in _entries(tmp_path):
        with open(path, "r+b") as f:
            f.seek(200)
            f.write(b"\x00garbage" * 64)
    again, stderr = _run(tmp_path)
    assert "damaged" in stderr and "capturing the step again" in stderr
    assert (again["captures"], again["warm"]) == (1, 0)
    assert again["losses"] == cold["losses"]
    repaired, _ = _run(tmp_path)   # the capture replaced the damaged entry
    assert (repaired["captures"], repaired["warm"]) == (0, 1)


@pytest.mark.slow
def test_a_step_with_closures_is_not_stored(tmp_path):
    _model_file(tmp_path)
    _run(tmp_path, CLOSURE="1")
    assert _entries(tmp_path) == []
    again, _ = _run(tmp_path, CLOSURE="1")
    assert (again["captures"], again["warm"]) == (1, 0)


def test_the_same_step_code_over_another_model_is_not_taken_for_it(tmp_path):
    """Two steps made by one function, each over its own model: the same code, arguments
    and state layout, but not the same program. The second is captured, not taken from the
    first's entry, and trains its own model as eager PyTorch does."""
    import copy

    import cerebras.pytorch as cstorch
    from tests.models import classifier_step

    backend = cstorch.backend("CSX", compile_dir=str(tmp_path / "compile_dir"))
    level = cstorch.backends.csx.precision.optimization_level
    cstorch.backends.csx.precision.optimization_level = 0
    try:
        nets = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            nets.append(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                            torch.nn.Linear(16, 3)))
        refs = [copy.deepcopy(n) for n in nets]
        steps = [classifier_step(cstorch.compile(n, backend),
                                 cstorch.optim.SGD(n.parameters(), lr=0.1)) for n in nets]
        gen = torch.Generator().manual_seed(2)
        x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        losses = []
        for step in steps:
            losses.append(float(step(x, y)))
            for n in nets:   # which parameters hold a gradient is alike for both calls
                n.zero_grad(set_to_none=True)
    finally:
        cstorch.backends.csx.precision.optimization_level = level
    assert [s.captures for s in steps] == [1, 1] and [s.warm_starts for s in steps] == [0, 0]
    _close(losses, [torch.nn.functional.cross_entropy(r(x), y).item() for r in refs])


def test_a_recursive_closure_in_the_key_is_described_once():
    """A watched function that closes over itself (a recursive inner function) has a
    stable description, equal for an equal function, instead of recursing without end."""
    from cstorch.tracing import warm

    def make(depth):
        def walk(n):
            return n if n <= 0 else walk(n - depth)
        return walk

    assert warm.stable(make(1)) == warm.stable(make(1))
    assert warm.stable(make(1)) != warm.stable(make(2))


def test_only_the_backend_that_named_compile_dir_stores_steps(tmp_path):
    """XLA's cache directory stays set for the process once a backend named one; a later
    backend that named none neither stores nor takes stored steps."""
    cstorch.backend("CSX", compile_dir=str(tmp_path / "cache"))
    assert cstorch.backend().compile_dir == str(tmp_path / "cache")
    cstorch.backend("CPU")
    assert cstorch.backend().compile_dir is None
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model)

    @cstorch.trace
    def step(x):
        return compiled(x).sum()

    step(torch.ones(4, 3))
    assert step.captures == 1
    assert not glob.glob(str(tmp_path / "cache" / "cstorch-steps" / "*"))


def test_a_run_with_hooks_does_not_take_a_stored_program(tmp_path):
    """A step stored while no hook was registered is not taken once the run has one (a
    new step object stands for a new process): it would run without the hook."""
    cstorch.backend("CSX", compile_dir=str(tmp_path / "compile_dir"))
    level = cstorch.backends.csx.precision.optimization_level
    cstorch.backends.csx.precision.optimization_level = 0
    try:
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 3)
        compiled = cstorch.compile(net)

        def forward(x):
            return compiled(x).sum()

        x = torch.randn(4, 8)
        first = cstorch.trace(forward)
        plain = float(first(x))
        assert first.captures == 1 and _entries(tmp_path)
        handle = net.register_forward_hook(lambda m, args, out: out * 2)
        second = cstorch.trace(forward)
        hooked = float(second(x))
        handle.remove()
    finally:
        cstorch.backends.csx.precision.optimization_level = level
    assert second.captures == 1 and second.warm_starts == 0
    assert abs(hooked - 2 * plain) <= 1e-5 * abs(plain)
