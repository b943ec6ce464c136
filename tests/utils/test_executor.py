"""DataLoader, DataExecutor, step and checkpoint closures, current_executor."""
import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch


def _loader(n_batches=3, batch=2):
    def input_fn(batch_size):
        x = torch.arange(n_batches * batch_size, dtype=torch.float32).reshape(-1, 1)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=batch_size)
    return cstorch.utils.data.DataLoader(input_fn, batch)


def _model_and_step(record, checkpoints):
    cstorch.backend("CPU")
    model = nn.Linear(1, 1)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)

    @cstorch.step_closure
    def closure(loss, first_x):
        record.append((cstorch.current_executor().user_iteration, float(loss), float(first_x)))

    @cstorch.checkpoint_closure
    def on_checkpoint(loss):
        checkpoints.append((cstorch.current_executor().user_iteration, float(loss)))

    @cstorch.trace
    def step(batch):
        (x,) = batch
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        closure(loss, x[0, 0])     # called once, while the step is captured
        on_checkpoint(loss)
        return loss

    return step


def test_closures_inside_a_traced_step_run_after_every_step_with_its_values():
    record, checkpoints, losses = [], [], []
    step = _model_and_step(record, checkpoints)
    executor = cstorch.utils.data.DataExecutor(_loader(), num_steps=7, checkpoint_steps=3)
    for batch in executor:
        losses.append(float(step(batch)))
    assert step.captures == 1
    assert [r[0] for r in record] == list(range(1, 8))
    assert [r[1] for r in record] == pytest.approx(losses)
    # three batches per pass, so the executor starts a new pass after three steps
    assert [r[2] for r in record] == [0.0, 2.0, 4.0, 0.0, 2.0, 4.0, 0.0]
    assert [c[0] for c in checkpoints] == [3, 6, 7]
    assert [c[1] for c in checkpoints] == pytest.approx([losses[2], losses[5], losses[6]])


def test_closures_outside_a_traced_step_run_where_called():
    calls = []

    @cstorch.step_closure
    def now(value):
        calls.append(("step", value))

    @cstorch.checkpoint_closure
    def maybe(step):
        calls.append(("ckpt", step))

    now(1)
    assert calls == [("step", 1)]
    executor = cstorch.utils.data.DataExecutor(_loader(), num_steps=4, checkpoint_steps=2)
    for i, _ in enumerate(executor, start=1):
        assert cstorch.current_executor().iteration == i - 1
        maybe(i)
    assert calls[1:] == [("ckpt", 2), ("ckpt", 4)]
    # no executor running: the real package refuses (behaviour.json data_executor)
    with pytest.raises(RuntimeError, match="outside of an execution context"):
        maybe(99)


def test_checkpoint_schedule_is_zero_indexed():
    seen = []
    Range = cstorch.utils.data.Schedule.Range
    schedule = cstorch.utils.data.Schedule([Range(0, 1, 1, False), Range(3, 4, 1, False)])
    executor = cstorch.utils.data.DataExecutor(_loader(), num_steps=5, checkpoint_steps=schedule)
    for _ in executor:
        if executor.on_checkpoint_step():
            seen.append(executor.user_iteration)
    assert seen == [1, 4]


def test_without_num_steps_the_executor_runs_one_pass():
    assert len(list(cstorch.utils.data.DataExecutor(_loader(n_batches=4)))) == 4


def test_executor_errors():
    with pytest.raises(TypeError, match="cstorch.utils.data.DataLoader"):
        cstorch.utils.data.DataExecutor([1, 2, 3])
    with pytest.raises(RuntimeError, match="num_steps"):
        cstorch.utils.data.DataExecutor(_loader(), num_steps=0)
    with pytest.raises(ValueError, match="checkpoint_steps"):
        cstorch.utils.data.DataExecutor(_loader(), checkpoint_steps=-1)
    with pytest.raises(ValueError, match="checkpoint_steps"):
        cstorch.utils.data.DataExecutor(_loader(), checkpoint_steps=lambda i: True)
    executor = cstorch.utils.data.DataExecutor(_loader(), num_steps=1)
    list(executor)
    assert len(list(executor)) == 1   # a second loop runs num_steps again, as the real one
    with pytest.raises(RuntimeError, match="no DataExecutor"):
        cstorch.current_executor()
    empty = cstorch.utils.data.DataLoader(lambda: [])
    with pytest.raises(RuntimeError, match="no batches"):
        list(cstorch.utils.data.DataExecutor(empty, num_steps=2))


def test_dataloader_errors():
    with pytest.raises(TypeError, match="input function"):
        cstorch.utils.data.DataLoader(torch.utils.data.DataLoader([1, 2]))
    with pytest.raises(TypeError, match="iterable"):
        iter(cstorch.utils.data.DataLoader(lambda: 5))
    assert len(_loader(n_batches=3)) == 3


def test_the_executors_position_read_inside_a_step_warns_and_a_closure_reads_it_right():
    """Read while the step is captured, the step number is built into the program: eager
    PyTorch would see 1, 2, 3, the program 1, 1, 1. That read warns, at the user's line; a
    step closure reads it after each step."""
    cstorch.backend("CPU")
    compiled = cstorch.compile(nn.Linear(1, 1))
    seen = []

    @cstorch.step_closure
    def record():
        seen.append(cstorch.current_executor().user_iteration)

    @cstorch.trace
    def step(batch):
        (x,) = batch
        record()
        return compiled(x).sum() * 0 + cstorch.current_executor().user_iteration

    executor = cstorch.utils.data.DataExecutor(_loader(n_batches=3), num_steps=3)
    with pytest.warns(UserWarning, match=r"user_iteration was read while a step was being "
                                         r"captured.*\(1\)") as caught:
        baked = [float(step(batch)) for batch in executor]
    assert caught[0].filename == __file__
    assert baked == [1.0, 1.0, 1.0]   # what the warning is about
    assert seen == [1, 2, 3]
    assert executor.user_iteration == 3 and executor.iteration == 2   # outside a step: no warning
