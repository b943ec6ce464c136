"""Every scheduler of the fixture reproduces the real package's rates, eagerly and inside
one traced step (one param group per schedule, selected by tag), and a checkpoint taken
mid-run resumes bit-exactly in a fresh process."""
import os
import subprocess
import sys

import pytest
import torch

import cerebras.pytorch as cstorch
from tests.optim.common import RTOL, SCHEDULERS, make_scheduler


def _close(actual, expected):
    return abs(actual - expected) <= RTOL * abs(expected) + 1e-7


@pytest.mark.parametrize("entry", list(SCHEDULERS))
def test_eager_rates(entry):
    cstorch.backend("CPU")
    w = torch.zeros(3, requires_grad=True)
    opt = cstorch.optim.SGD([w], lr=1.0)
    scheduler = make_scheduler(entry, opt)
    for i, expected in enumerate(SCHEDULERS[entry]["lr_before_each_step"]):
        lr = float(opt.param_groups[0]["lr"])
        assert _close(lr, expected), (i, lr, expected)
        w.grad = torch.ones(3)
        opt.step()
        scheduler.step()
    assert scheduler.last_epoch == 16


def test_traced_rates_all_schedules_in_one_step():
    cstorch.backend("CPU")
    entries = list(SCHEDULERS)
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(2)) for _ in entries])
    compiled = cstorch.compile(model)
    opt = cstorch.optim.SGD([{"params": [p], "tags": {name}} for p, name in zip(model, entries)], lr=1.0)
    schedulers = [make_scheduler(name, opt, tags=name) for name in entries]

    @cstorch.trace
    def step(x):
        lrs = [g["lr"] * 1 for g in opt.param_groups]
        opt.zero_grad()
        loss = sum((p * x).sum() for p in compiled.parameters())
        loss.backward()
        opt.step()
        for s in schedulers:
            s.step()
        return lrs

    x = torch.ones(2)
    for i in range(16):
        lrs = step(x)
        for name, lr in zip(entries, lrs):
            expected = SCHEDULERS[name]["lr_before_each_step"][i]
            assert _close(float(lr), expected), (name, i, float(lr), expected)
    assert step.captures == 1
    # The parameters moved by the sum of the rates their schedule gave.
    for p, name in zip(model, entries):
        total = sum(SCHEDULERS[name]["lr_before_each_step"])
        assert abs(-float(p.detach()[0]) - total) <= 1e-4 * max(1.0, total), name
    assert schedulers[0].last_epoch == 16


RUN = r"""
import sys, torch
sys.path.insert(0, {root!r})
import cerebras.pytorch as cstorch
from tests.optim.common import Linear, problem, traced_step
mode, path = sys.argv[1], sys.argv[2]
cstorch.backend("CPU")
w, b, data = problem()
model = Linear(w, b)
compiled = cstorch.compile(model)
opt = cstorch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
sched = cstorch.optim.lr_scheduler.CosineDecayLR(opt, initial_learning_rate=0.01,
                                                 end_learning_rate=0.001, total_iters=12)
step = traced_step(compiled, opt, sched)
batches = data + data
start = 0
if mode == "resume":
    ckpt = cstorch.load(path)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    sched.load_state_dict(ckpt["scheduler"])
    start = 6
losses = []
for i in range(start, 12):
    losses.append(step(*batches[i]).item())
    if mode == "save" and i == 5:
        cstorch.save({{"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "scheduler": sched.state_dict()}}, path)
print("LOSSES", repr(losses))
"""


def _run(script, mode, path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, script, mode, path], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [l for l in out.stdout.splitlines() if l.startswith("LOSSES")][-1]
    return eval(line[len("LOSSES"):])


def test_checkpoint_resumes_bit_exactly_in_fresh_process(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = tmp_path / "run.py"
    script.write_text(RUN.format(root=root))
    ckpt = str(tmp_path / "ckpt.mdl")
    full = _run(str(script), "save", ckpt)
    resumed = _run(str(script), "resume", ckpt)
    assert len(full) == 12 and len(resumed) == 6
    assert resumed == full[6:]
