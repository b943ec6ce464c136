"""A large parameter that the backward pass reads after the optimizer could update it is
not donated on the CPU: XLA would copy it every step before writing its new value into
its buffer. Training is unchanged; the copies are gone."""
import copy
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

import bridge
import cerebras.pytorch as cstorch
from cstorch.tracing.capture import KEEP_MIN_BYTES
from tests.models import classifier_step

TOL = 1e-4


def _model():
    torch.manual_seed(0)
    # The second layer's weight (512 KiB) is read by the backward pass (the gradient of the
    # first layer's output); the first layer's input needs no gradient, so nothing reads
    # its weight after the forward pass.
    return nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 4))


def _copied_entry_parameters(hlo: str) -> list:
    entry = hlo[hlo.index("ENTRY"):]
    params = set(re.findall(r"%(\S+) = \S+ parameter\(\d+\)", entry))
    return [name for name in re.findall(r"= \S+ copy\(%(\S+?)\)", entry) if name in params]


def _train(optimizer_name, kwargs, steps=4):
    model = _model()
    reference = copy.deepcopy(model)
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    optimizer = getattr(cstorch.optim, optimizer_name)(model.parameters(), **kwargs)

    step = classifier_step(compiled, optimizer)

    ref_opt = getattr(cstorch.optim, optimizer_name)(reference.parameters(), **kwargs)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(16, 32, generator=gen), torch.randint(0, 4, (16,), generator=gen)
        loss = step(x, y)
        ref_loss = F.cross_entropy(reference(x), y)
        ref_opt.zero_grad()
        ref_loss.backward()
        ref_opt.step()
        assert abs(float(loss) - ref_loss.item()) <= TOL * abs(ref_loss.item())
    for (name, ours), theirs in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.allclose(ours, theirs, rtol=TOL, atol=1e-6), name
    program = next(iter(step.programs.values()))[0]
    # The model is returned too: the state of a model no one holds is dropped.
    return backend, program, model


def test_a_large_parameter_read_by_the_backward_pass_is_not_donated_and_not_copied():
    backend, program, _model_kept = _train("SGD", dict(lr=0.1, momentum=0.9))
    names = list(backend.state.names)
    kept = [names[i] for i in program.compiled.kept]
    assert kept == ["model.2.weight"], kept
    assert 512 * 256 * 4 >= KEEP_MIN_BYTES
    copied = _copied_entry_parameters(program.compiled.executable.as_text())
    assert len(copied) < _copies_with_every_array_donated(), copied


def test_adamw_trains_like_eager_with_a_kept_parameter():
    backend, program, _model_kept = _train("AdamW", dict(lr=1e-2, weight_decay=0.1))
    assert [backend.state.names[i] for i in program.compiled.kept] == ["model.2.weight"]


def test_every_array_is_donated_when_the_kept_ones_would_hold_too_much(monkeypatch):
    """Kept arrays take a second buffer each: past KEEP_MAX_TOTAL_BYTES of them (a large
    model), every state array is donated and training is unchanged."""
    import cstorch.tracing.capture as capture
    monkeypatch.setattr(capture, "KEEP_MAX_TOTAL_BYTES", 512 * 256 * 4 - 1)
    _, program, _ = _train("AdamW", dict(lr=1e-2, weight_decay=0.1))
    assert program.compiled.kept == ()


def test_read_after_update_follows_foreach_elements_and_views():
    """Each parameter's update is its own computation inside one foreach op, and a
    transposed weight is still the weight: the second layer's weight is read late (by the
    gradient of the hidden layer), the first's is not, unless its old value is returned."""
    w1, w2, x = torch.randn(8, 4), torch.randn(3, 8), torch.randn(5, 4)

    def fn(w1, w2, x, also_old=False):
        (x @ w1.t()).relu().matmul(w2.t()).sum().backward()
        new = torch._foreach_add([w1, w2], [w1.grad, w2.grad], alpha=-0.1)
        return [*new, w1] if also_old else new

    graph = bridge.capture(fn, [w1, w2, x], [True, True, False])
    assert bridge.read_after_update(graph, 2) == [False, True]
    graph = bridge.capture(lambda *a: fn(*a, also_old=True), [w1, w2, x], [True, True, False])
    assert bridge.read_after_update(graph, 2) == [True, True]
    # Updated without a foreach op, by one subtraction per parameter: the same answer.
    graph = bridge.capture(
        lambda w1, w2, x: [w - 0.1 * g for w, g in zip((w1, w2), _grads(w1, w2, x))],
        [w1, w2, x], [True, True, False])
    assert bridge.read_after_update(graph, 2) == [False, True]


def _grads(w1, w2, x):
    (x @ w1.t()).relu().matmul(w2.t()).sum().backward()
    return w1.grad, w2.grad


def _copies_with_every_array_donated():
    """The entry parameters XLA copies when every state array is donated (the old rule):
    the second layer's weight among them."""
    import cstorch.tracing.capture as capture
    keep = capture._kept_state
    capture._kept_state = lambda *a: ()
    try:
        _, program, _ = _train("SGD", dict(lr=0.1, momentum=0.9), steps=1)
    finally:
        capture._kept_state = keep
    hlo = program.compiled.executable.as_text()
    assert program.compiled.kept == ()
    assert any("f32[256,512]" in line and " copy(" in line for line in hlo.splitlines())
    return len(_copied_entry_parameters(hlo))
