"""A program takes only the state its step reads or writes: a second model in the run (and
its optimizer) is no input of a step that does not use it, and keeps its values."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from tests.models import classifier_step

TOL = 1e-4


def _net(seed, width):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 3))


def test_a_step_takes_only_the_state_it_uses():
    a, b = _net(0, 16), _net(1, 24)
    ref_a, ref_b = copy.deepcopy(a), copy.deepcopy(b)
    backend = cstorch.backend("CPU")
    ca, cb = cstorch.compile(a, backend), cstorch.compile(b, backend)
    opt_a = cstorch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    opt_b = cstorch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)

    step_a, step_b = classifier_step(ca, opt_a), classifier_step(cb, opt_b)
    ref_opt_a = torch.optim.SGD(ref_a.parameters(), lr=0.1, momentum=0.9)
    ref_opt_b = torch.optim.SGD(ref_b.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(2)
    for k in range(4):
        x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        ours_a = step_a(x, y)
        ref_loss = F.cross_entropy(ref_a(x), y)
        ref_opt_a.zero_grad()
        ref_loss.backward()
        ref_opt_a.step()
        assert abs(float(ours_a) - ref_loss.item()) <= TOL * abs(ref_loss.item())
        if k % 2:   # b trains every other step, a's steps leave it as it was
            ours_b = step_b(x, y)
            ref_loss = F.cross_entropy(ref_b(x), y)
            ref_opt_b.zero_grad()
            ref_loss.backward()
            ref_opt_b.step()
            assert abs(float(ours_b) - ref_loss.item()) <= TOL * abs(ref_loss.item())
    for ours, theirs in ((a, ref_a), (b, ref_b)):
        for (name, p), q in zip(ours.state_dict().items(), theirs.state_dict().values()):
            assert torch.allclose(p, q, rtol=TOL, atol=1e-6), name

    state = backend.state
    cells_of = {}
    for e in state.entries:
        cells_of.setdefault(e.name.split(".")[0], set()).add(e.cell)
    # a's 4 parameters and their 4 momentum buffers (held under "optimizer"), and b's
    program_a = next(iter(step_a.programs.values()))[0]
    program_b = next(iter(step_b.programs.values()))[0]
    for program, own, other in ((program_a, "model", "model1"), (program_b, "model1", "model")):
        assert program.used is not None
        assert cells_of[own] <= set(program.used)
        assert not cells_of[other] & set(program.used)
        assert len(program.used) == 8   # 4 parameters, 4 momentum buffers
        invars = program.compiled.jaxpr().jaxpr.invars
        # the hyperparameter vector, x and y, the PRNG pair
        assert len(invars) == 8 + len(program.grad_inputs) + 1 + 2 + 1
