"""Debugging a lowered step: ATen names and model lines in the program's locations,
what a re-capture logs, graph changes under retrace_every_iteration, and the first op
that made a NaN."""
import inspect
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        hidden = self.fc(x)          # the line the matmul comes from
        return torch.log(hidden)     # NaN where hidden < 0


def _line(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _setup(lr=0.1):
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = Net()
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=lr)

    @cstorch.trace
    def step(x):
        loss = compiled(x).nan_to_num().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    return model, optimizer, step


def test_stablehlo_and_hlo_name_the_model_line_of_each_matmul():
    _, _, step = _setup()
    where = f"test_debugging.py:{_line(Net.forward, 'self.fc(x)')}"
    text = step.to_jax(torch.randn(2, 3)).stablehlo()
    # every dot (forward and gradient matmuls) is located at the model's line
    dots = [line for line in text.splitlines() if line.startswith("#loc") and "/dot_general" in line]
    assert len(dots) >= 2
    assert all(where in line for line in dots), dots
    assert any("aten.mm.default" in line for line in dots)    # a gradient matmul
    step(torch.randn(2, 3))
    program = next(iter(step.programs.values()))[0]
    hlo = program.compiled.executable.as_text()
    assert f'aten.addmm.default {where}' in hlo   # op_name metadata: profiles show it


def test_check_finite_names_the_first_op_and_line_that_made_a_nan():
    flags = cstorch.backends.csx.debug
    flags.check_finite = True
    try:
        _, _, step = _setup()
        where = f"test_debugging.py:{_line(Net.forward, 'torch.log(hidden)')}"
        with pytest.raises(FloatingPointError, match=f"first at aten.log.default {where}"):
            # some outputs of fc are negative: log gives NaN
            step(torch.randn(8, 3, generator=torch.Generator().manual_seed(0)) * 100)
    finally:
        flags.reset()


def test_a_recapture_logs_what_changed(caplog):
    model, optimizer, step = _setup()
    caplog.set_level(logging.INFO, logger="cstorch")
    step(torch.randn(2, 3))
    step(torch.randn(5, 3))
    assert "argument 0: shape (2, 3) -> (5, 3)" in caplog.text
    optimizer.param_groups[0]["lr"] = 0.0
    step(torch.randn(5, 3))
    assert "optimizer setting 'lr': non-zero -> zero" in caplog.text
    assert step.captures == 3 and len(step.recaptures) == 2

    @cstorch.trace
    def cast_step(x):
        return model(x.float()).nan_to_num().mean()

    cast_step(torch.randn(5, 3))
    cast_step(torch.randn(5, 3).double())
    assert "dtype torch.float32 -> torch.float64" in caplog.text
    assert cast_step.captures == 2


USE_RELU = [False]


def test_retrace_every_iteration_reports_a_changed_graph(caplog):
    cstorch.backend("CPU")
    cstorch.backends.csx.debug.retrace_every_iteration = True
    try:
        model = nn.Linear(3, 3)
        compiled = cstorch.compile(model)

        @cstorch.trace
        @torch.no_grad()
        def step(x):
            y = compiled(x)
            return F.relu(y) if USE_RELU[0] else y

        x = torch.randn(2, 3)
        step(x)
        step(x)
        assert step.captures == 2 and step.recaptures == []   # same graph: nothing to say
        USE_RELU[0] = True
        step(x)
        assert "the graph of step changed at capture 3" in caplog.text
        assert any("relu" in line for line in step.recaptures[-1])
        assert len(step.programs) == 1 and len(next(iter(step.programs.values()))) == 1
    finally:
        USE_RELU[0] = False
        cstorch.backends.csx.debug.reset()
