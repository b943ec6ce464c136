"""The DataExecutor against the real package (behaviour.json `data_executor`): a traced
SGD step on the CPU backend over 8 batches, with a step closure and a checkpoint closure
called in the step and in the loop's body. Each case compares the executor's length, its
checkpoint schedule, the effective activation steps, the logged warnings, what the loop
reads each step, the order in which closures run, the final weights, and a second loop
over the same executor."""
import json
import logging
import math
import os

import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils.data import DataExecutor, DataLoader, Schedule
from tests.conftest import SHARED

SCENARIO = json.load(open(os.path.join(SHARED, "fixtures", "behaviour.json")))["scenarios"][
    "data_executor"]
CASES = SCENARIO["cases"]
# Python run inside a traced step runs when the step is captured, not at every step (the
# step is a compiled program); these markers the real package's eager CPU step appends
# each step are compared apart.
IN_STEP = (["step_fn_start"], ["step_fn_end"])


def _input_fn():
    return [(torch.tensor([[math.sin(i + 1), math.cos(i + 1)]], dtype=torch.float32),
             torch.tensor([[0.1 * i]], dtype=torch.float32)) for i in range(8)]


def _kwargs(recorded):
    kwargs = dict(recorded)
    value = kwargs.get("checkpoint_steps")
    if isinstance(value, str):
        kwargs["checkpoint_steps"] = (eval(value, {"Schedule": Schedule}) if value.startswith("Schedule")
                                      else float(value))
    return kwargs


class _Run:
    """The scenario's model, step and closures, logging into `events`."""

    def __init__(self):
        cstorch.backend("CPU")
        model = torch.nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[0.5, -0.25]]))
        self.model = model
        compiled = cstorch.compile(model)
        optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)
        self.events = events = []

        @cstorch.step_closure
        def closure_in_step(loss):
            events.append(["step_closure_called_in_step", cstorch.current_executor().user_iteration,
                           round(float(loss), 6)])

        @cstorch.checkpoint_closure
        def ckpt_in_step():
            events.append(["checkpoint_closure_called_in_step",
                           cstorch.current_executor().user_iteration])

        @cstorch.trace
        def step(x, y):
            events.append(["step_fn_start"])
            loss = torch.nn.functional.mse_loss(compiled(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            closure_in_step(loss)
            ckpt_in_step()
            events.append(["step_fn_end"])
            return loss

        @cstorch.step_closure
        def closure_in_body(n):
            events.append(["step_closure_called_in_body", cstorch.current_executor().user_iteration, n])

        @cstorch.checkpoint_closure
        def ckpt_in_body():
            events.append(["checkpoint_closure_called_in_body",
                           cstorch.current_executor().user_iteration])

        @cstorch.checkpoint_closure
        def ckpt_before_loop():
            events.append(["checkpoint_closure_called_before_loop",
                           cstorch.current_executor().user_iteration])

        self.step, self.closure_in_body, self.ckpt_in_body = step, closure_in_body, ckpt_in_body
        self.ckpt_before_loop = ckpt_before_loop

    def loop(self, executor):
        per_step = []
        for n, (x, y) in enumerate(executor, start=1):
            ctx = executor.run_context
            per_step.append({"iteration": executor.iteration,
                             "user_iteration": executor.user_iteration,
                             "is_initial_step": executor.is_initial_step,
                             "on_final_iteration": executor.on_final_iteration,
                             "is_checkpoint_step": ctx.is_checkpoint_step,
                             "is_activation_step": ctx.is_activation_step})
            self.events.append(["body_start", n])
            self.step(x, y)
            self.events.append(["body_after_step", n])
            self.closure_in_body(n)
            self.ckpt_in_body()
            self.events.append(["body_end", n])
        self.events.append(["after_loop"])
        return per_step


def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "ctor" not in c])
def test_case(name, caplog):
    case = CASES[name]
    run = _Run()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        executor = DataExecutor(DataLoader(_input_fn), **_kwargs(case["kwargs"]))
    assert _messages(caplog) == case["ctor_warnings"]
    assert len(executor) == case["len"]
    assert executor.run_context.activation_steps == case["activation_steps_effective"]
    schedule = executor.run_context.checkpoint_schedule
    assert repr(schedule) == case["checkpoint_schedule"]
    assert list(schedule) == case["checkpoint_schedule_list"]
    if "before_loop_call" in case:
        run.ckpt_before_loop()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        per_step = run.loop(executor)
    assert _messages(caplog) == case["run_warnings"]
    assert per_step == case["per_step"]
    got = [e for e in run.events if e not in IN_STEP]
    expected = [e for e in case["events"] if e not in IN_STEP]
    assert [e[:2] for e in got] == [e[:2] for e in expected]
    for g, e in zip(got, expected):
        if e[0] == "step_closure_called_in_step":
            assert g[2] == pytest.approx(e[2], rel=1e-4, abs=2e-6)
        else:
            assert g == e
    # the step's own Python ran when it was captured, once, in the first step
    assert [e for e in run.events if e in IN_STEP] == list(IN_STEP)
    assert run.step.captures == 1
    weight = run.model.weight.detach().cpu().reshape(-1).tolist()
    assert weight == pytest.approx(case["weight_after"], rel=1e-4)
    assert sum(1 for _ in executor) == case["iterate_again_yields"]["value"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "ctor" in c])
def test_construction_error(name):
    case = CASES[name]
    cstorch.backend("CPU")
    expected = case["ctor"]
    with pytest.raises(Exception) as info:
        DataExecutor(DataLoader(_input_fn), **_kwargs(case["kwargs"]))
    assert (type(info.value).__name__, str(info.value)) == (expected["error"], expected["message"])


def test_checkpoint_closure_outside_an_executor_is_refused():
    run = _Run()
    list(DataExecutor(DataLoader(_input_fn), num_steps=1))   # a finished run
    run.events.clear()
    recorded = SCENARIO["checkpoint_closure_outside_executor"]
    with pytest.raises(Exception) as info:
        run.ckpt_in_body()
    assert (type(info.value).__name__, str(info.value)) == (recorded["result"]["error"],
                                                            recorded["result"]["message"])
    assert run.events == recorded["events"]
