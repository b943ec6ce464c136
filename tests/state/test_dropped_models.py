"""A model (and optimizer) the user drops frees its device arrays: the backend holds what
it was given weakly, so the user's last reference going drops that state from the run.
Models still held keep training as eager PyTorch does."""
import gc
import os
import subprocess
import sys

import jax
import pytest
import torch
import torch.nn.functional as F

import cstorch
from tests.models import rel_err

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WIDTH = 384   # 1.2 MB of weights; as much again in gradients and in each moment


@pytest.fixture(autouse=True)
def fresh_backend():
    gc.collect()   # what earlier tests dropped is gone before this one counts bytes
    return cstorch.backend("CPU")


def live_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays())


def make(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                               torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                               torch.nn.Linear(WIDTH, 8))


def data(steps, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, WIDTH, generator=g), torch.randn(16, 8, generator=g))
            for _ in range(steps)]


def model_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def eager_losses(seed, batches):
    """SGD with momentum in eager PyTorch: the losses and the final parameters."""
    model = make(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def holder_step(ctx):
    """A traced training step that reaches its model and optimizer through `ctx`, as a step
    reading module-level globals does: dropping them leaves the step itself alive."""
    @cstorch.trace
    def step(x, y):
        loss = F.mse_loss(ctx["model"](x), y)
        ctx["opt"].zero_grad()
        loss.backward()
        ctx["opt"].step()
        return loss
    return step


def train(ctx, seed, batches):
    """Compile a new model into `ctx`, train it with `ctx`'s step; its losses."""
    model = make(seed)
    ctx["model"] = cstorch.compile(model)
    ctx["opt"] = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return [float(ctx["step"](x, y)) for x, y in batches], model


def test_a_dropped_model_frees_its_arrays_and_the_next_one_trains_as_eager():
    base = live_bytes()
    ctx = {}
    ctx["step"] = holder_step(ctx)
    batches = data(2)
    losses, model = train(ctx, 0, batches)
    size = model_bytes(model)
    held = live_bytes() - base
    # Weights, momentum buffers and gradients at least.
    assert held >= 3 * size, (held, size)
    assert all(rel_err(a, b) < 1e-4 for a, b in zip(losses, eager_losses(0, batches)[0]))
    del model
    ctx.pop("model"), ctx.pop("opt")
    gc.collect()
    left = live_bytes() - base
    assert left < size / 10, f"{left} bytes of {held} still held after the model was dropped"
    assert not ctx["step"].programs   # the programs of the old layout went with it
    # A second model, trained by the same step after the first was dropped.
    batches = data(3, seed=5)
    losses, model = train(ctx, 1, batches)
    want, params = eager_losses(1, batches)
    for a, b in zip(losses, want):
        assert rel_err(a, b) < 1e-4, (losses, want)
    for p, q in zip(model.parameters(), params):
        assert rel_err(p.detach(), q) < 1e-4


def closing_step(model):
    """The usual traced step: it closes over its compiled model and optimizer (AdamW)."""
    compiled = cstorch.compile(model)
    opt = cstorch.optim.AdamW(model.parameters(), lr=1e-2)

    @cstorch.trace
    def step(x, y):
        loss = F.mse_loss(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step


def test_a_step_that_closes_over_the_model_is_dropped_with_it():
    """The user drops such a step with its model: the compiled model and optimizer it
    closes over are the user's references too."""
    base = live_bytes()
    model = make(0)
    step = closing_step(model)
    for x, y in data(2):
        loss = step(x, y)
    float(loss)
    size = model_bytes(model)
    assert live_bytes() - base >= 4 * size   # weights, gradients, two moments
    del model, step, loss
    gc.collect()
    assert live_bytes() - base < size / 10


def test_the_model_still_held_trains_on_as_eager_after_another_is_dropped():
    """Two models in one process, each with its optimizer and step; the first is dropped
    between steps. The second's state keeps its names and trains as in eager PyTorch."""
    backend = cstorch.backend()
    first, second = make(0), make(1)
    ctx_a = {"model": cstorch.compile(first),
             "opt": cstorch.optim.SGD(first.parameters(), lr=0.1, momentum=0.9)}
    ctx_b = {"model": cstorch.compile(second),
             "opt": cstorch.optim.SGD(second.parameters(), lr=0.1, momentum=0.9)}
    step_a, step_b = holder_step(ctx_a), holder_step(ctx_b)
    batches = data(4, seed=7)
    losses = []
    for i, (x, y) in enumerate(batches):
        if i == 2:
            step_a(x, y)
            names_before = [n for n in backend.state.names if n.startswith(("model1.", "optimizer1."))]
            del first, ctx_a, step_a   # the step holds ctx_a: dropped too
            gc.collect()
            assert not any(n.startswith(("model.", "optimizer.")) for n in backend.state.names)
            assert [n for n in backend.state.names if n.startswith(("model1.", "optimizer1."))] \
                == names_before
        elif i < 2:
            step_a(x, y)
        losses.append(float(step_b(x, y)))
    want, params = eager_losses(1, batches)
    for a, b in zip(losses, want):
        assert rel_err(a, b) < 1e-4, (losses, want)
    for p, q in zip(second.parameters(), params):
        assert rel_err(p.detach(), q) < 1e-4
    # Its state_dict and a checkpoint of it still hold every tensor, with the trained values.
    for (name, t), q in zip(second.state_dict().items(), params):
        assert rel_err(t, q) < 1e-4, name


def test_a_model_collected_during_a_step_is_dropped_after_it():
    """The garbage collector may collect a model while a step is captured or run (the
    state's layout is then in use): its state is dropped when the step is done."""
    state = cstorch.backend().state
    model = make(0)
    model.cycle = [model]   # only the collector frees it
    cstorch.compile(model)
    del model
    with state.in_use:
        gc.collect()
        assert any(n.startswith("model.") for n in state.names)
    assert not state.names


def test_a_dropped_grad_scaler_and_metric_leave_the_state():
    state = cstorch.backend().state
    scaler = cstorch.amp.GradScaler(loss_scale="dynamic")
    metric = cstorch.metrics.AccuracyMetric("acc")
    state.add_metric(metric)
    state.refresh()
    assert any(n.startswith("grad_scaler.") for n in state.names)
    assert any(n.startswith("metrics.acc.") for n in state.names)
    del scaler, metric
    gc.collect()
    assert state.names == []


EXIT_SCRIPT = """
import torch
import cstorch
cstorch.backend("CPU")
model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(200)])
compiled = cstorch.compile(model)
optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3)
print("done")
"""


def test_exit_with_a_large_state_is_silent():
    """A process that built the state of a model with many tensors exits without noise:
    the owners collected at interpreter exit do not rebuild the state one by one (that
    allocated enough to start collections after JAX's module was cleared, each printing
    "Exception ignored in: <function _xla_gc_callback ...>")."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "done"
    assert "Exception ignored" not in proc.stderr, proc.stderr[-2000:]
