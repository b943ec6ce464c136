"""The fixture's tiny problem, built the way the real package's trajectories were recorded."""
import json
import os

import torch

import cerebras.pytorch as cstorch

from tests.conftest import SHARED

FIXTURE = os.path.join(SHARED, "fixtures", "optim_trajectories.json")
with open(FIXTURE) as f:
    FIX = json.load(f)
OPTIMIZERS = FIX["optimizers"]
SCHEDULERS = FIX["schedulers"]
RTOL = 1e-5

# Fixture entry -> cstorch.optim class.
OPT_CLASS = {name: name.split("_")[0] for name in OPTIMIZERS}


def problem():
    """w, b and the 8 (x, y) batches: all x are drawn before all y."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 3, generator=g)
    b = torch.randn(4, generator=g)
    xs = [torch.randn(5, 3, generator=g) for _ in range(8)]
    ys = [torch.randn(5, 4, generator=g) for _ in range(8)]
    return w, b, list(zip(xs, ys))


def loss_fn(w, b, x, y):
    return ((x @ w.t() + b - y) ** 2).mean()


def rel_err(actual, expected):
    a = torch.as_tensor(actual, dtype=torch.float64).flatten()
    e = torch.as_tensor(expected, dtype=torch.float64).flatten()
    return ((a - e).abs() / e.abs().clamp_min(1e-7)).max().item()


class Linear(torch.nn.Module):
    def __init__(self, w, b):
        super().__init__()
        self.w = torch.nn.Parameter(w.clone())
        self.b = torch.nn.Parameter(b.clone())

    def forward(self, x):
        return x @ self.w.t() + self.b


def traced_step(compiled, optimizer, scheduler=None):
    """A `@cstorch.trace` step on the fixture's loss: zero_grad, backward, step (and the
    scheduler's step)."""
    @cstorch.trace
    def step(x, y):
        optimizer.zero_grad()
        loss = ((compiled(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        return loss
    return step


def make_scheduler(name, optimizer, tags=None):
    sched = cstorch.optim.lr_scheduler
    if name.startswith("SequentialLR"):
        return sched.SequentialLR(optimizer, [
            sched.LinearLR(optimizer, initial_learning_rate=0.1, end_learning_rate=1.0, total_iters=4,
                           param_group_tags=tags),
            sched.CosineDecayLR(optimizer, initial_learning_rate=1.0, end_learning_rate=0.0,
                                total_iters=8, param_group_tags=tags)],
            milestones=[4], param_group_tags=tags)
    cls = getattr(sched, name.split("_")[0])
    return cls(optimizer, **SCHEDULERS[name]["kwargs"], param_group_tags=tags)
