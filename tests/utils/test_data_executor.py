"""DataExecutor: num_steps, checkpoint schedules, activation steps, deprecated arguments,
the profiler and the run's artifact directory."""

import pytest
import torch
import torch.nn as nn

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils.data import DataExecutor, DataLoader, Schedule


def _loader(n_batches=4, batch=2):
    def input_fn():
        x = torch.arange(n_batches * batch, dtype=torch.float32).reshape(-1, 1)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=batch)
    return DataLoader(input_fn)


def _traced_step(step_calls, checkpoint_calls, backend=("CPU",), **backend_kwargs):
    cstorch.backend(*backend, **backend_kwargs)
    model = nn.Linear(1, 1)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)

    @cstorch.step_closure
    def on_step(loss):
        step_calls.append((cstorch.current_executor().user_iteration, float(loss)))

    @cstorch.checkpoint_closure
    def on_checkpoint(loss):
        checkpoint_calls.append(cstorch.current_executor().user_iteration)

    @cstorch.trace
    def step(batch):
        (x,) = batch
        loss = compiled(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        on_step(loss)
        on_checkpoint(loss)
        return loss

    return step


def test_schedule_of_zero_indexed_ranges_picks_the_checkpoint_steps():
    steps, checkpoints = [], []
    step = _traced_step(steps, checkpoints)
    schedule = Schedule([Schedule.Range(start=1, end=9, step=3, include_last=True)])
    for batch in DataExecutor(_loader(), num_steps=10, checkpoint_steps=schedule):
        step(batch)
    assert checkpoints == [2, 5, 8, 9]
    assert [s[0] for s in steps] == list(range(1, 11))


def test_int_checkpoint_steps_take_every_multiple_and_the_last_step():
    seen = []
    executor = DataExecutor(_loader(), num_steps=12, checkpoint_steps=5)
    for _ in executor:
        if executor.on_checkpoint_step():
            seen.append(executor.user_iteration)
    assert seen == [5, 10, 12]


def test_schedule_contents():
    r = Schedule.Range(start=4, end=12, step=5, include_last=True)
    assert list(r) == [4, 9, 11] and r.match(11) and not r.match(10) and not r.match(3)
    s = Schedule([Schedule.Range(0, 6, 3, False), Schedule.Range(6, 13, 4, False)])
    assert list(s) == [0, 3, 6, 10]
    with pytest.raises(ValueError, match="step \\(0\\) must be an integer greater than zero"):
        Schedule.Range(start=0, end=5, step=0, include_last=False)
    with pytest.raises(ValueError, match="Schedule.Range"):
        Schedule([3])


def test_activation_steps_are_reduced_to_divide_checkpoint_steps(caplog):
    """activation_steps only says which steps are activation steps: on the CPU backend the
    step closures run after every step (the real package does), checkpoint closures on
    checkpoint steps."""
    steps, checkpoints = [], []
    step = _traced_step(steps, checkpoints)
    with caplog.at_level("WARNING"):
        executor = DataExecutor(_loader(), num_steps=12, checkpoint_steps=6, activation_steps=4)
    assert "Activation frequency was reduced from 4 to 2" in caplog.text
    assert executor.activation_steps == 2 and executor.run_context.activation_steps == 2
    activation = []
    losses = []
    for batch in executor:
        activation.append(executor.run_context.is_activation_step)
        losses.append(float(step(batch)))
    assert [s[0] for s in steps] == list(range(1, 13))
    assert [s[1] for s in steps] == pytest.approx(losses)
    assert checkpoints == [6, 12]
    assert [i for i, a in enumerate(activation, 1) if a] == [2, 4, 6, 8, 10, 12]


def test_on_csx_step_closures_run_on_activation_steps_only(tmp_path):
    """A Cerebras system fetches values on activation steps only: there, as on the real
    CSX backend, step closures run on those steps; checkpoint closures on checkpoint
    steps."""
    steps, checkpoints = [], []
    step = _traced_step(steps, checkpoints, ("CSX",), artifact_dir=str(tmp_path))
    try:
        executor = DataExecutor(_loader(), num_steps=6, checkpoint_steps=4, activation_steps=2)
        for batch in executor:
            step(batch)
    finally:
        cstorch.backend("CPU")
    assert [s[0] for s in steps] == [2, 4, 6]
    assert checkpoints == [4, 6]


def test_activation_steps_are_every_nth_and_the_last_step(caplog):
    schedule = Schedule([Schedule.Range(1, 2, 1, False)])   # user step 2
    with caplog.at_level("WARNING"):
        DataExecutor(_loader(), num_steps=7, checkpoint_steps=schedule, activation_steps=3)
    assert "reduced from 3 to 1" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        executor = DataExecutor(_loader(), num_steps=7, activation_steps=3)
    assert caplog.text == ""   # aligned already: no warning
    seen = [executor.user_iteration for _ in executor if executor.on_activation_step()]
    assert seen == [3, 6, 7]


def test_num_steps_from_the_dataloader_length_or_a_clear_error():
    assert len(DataExecutor(_loader(n_batches=3))) == 3
    endless = DataLoader(lambda: iter(lambda: torch.zeros(2), None))
    with pytest.raises(ValueError, match="num_steps is required.*no length"):
        DataExecutor(endless)
    assert len(list(DataExecutor(endless, num_steps=5))) == 5
    with pytest.raises(RuntimeError, match="no batches"):
        DataExecutor(DataLoader(lambda: []))
    with pytest.raises(RuntimeError, match="produced no batches"):
        list(DataExecutor(DataLoader(lambda: (x for x in ())), num_steps=2))


@pytest.mark.parametrize("mode", ["compile_only", "validate_only"])
def test_compile_and_validate_only_runs_take_one_step(mode, tmp_path):
    cstorch.backend("CSX", artifact_dir=str(tmp_path), **{mode: True})
    assert len(DataExecutor(_loader())) == 1
    with pytest.warns(UserWarning, match=f"{mode}: the executor runs 1 step, not 5"):
        executor = DataExecutor(_loader(), num_steps=5)
    assert len(list(executor)) == 1
    cstorch.backend("CPU")


def test_exploring_micro_batch_sizes_takes_one_step(tmp_path):
    cstorch.backend("CSX", artifact_dir=str(tmp_path))
    flags = cstorch.backends.csx.performance
    try:
        flags.micro_batch_size = {"explore": {"min": 1, "max": 2}}
        assert len(DataExecutor(_loader())) == 1
        flags.micro_batch_size = 2
        assert len(DataExecutor(_loader())) == 4
    finally:
        flags.reset()
        cstorch.backend("CPU")


def test_deprecated_arguments_warn_and_bad_writer_is_refused():
    cstorch.backend("CPU")
    with pytest.raises(TypeError, match="writer must be a cstorch.utils.tensorboard.SummaryWriter"):
        with pytest.warns(FutureWarning):
            DataExecutor(_loader(), writer=object())
    with pytest.warns(FutureWarning, match="cs_config=...\\) is deprecated"):
        DataExecutor(_loader(), cs_config=cstorch.utils.CSConfig())
    flags = cstorch.backends.csx.performance
    try:
        with pytest.warns(FutureWarning, match="micro_batch_size=...\\) is deprecated"):
            DataExecutor(_loader(), micro_batch_size=4)
        assert flags.micro_batch_size == 4
        with pytest.raises(ValueError, match="micro_batch_size"):
            with pytest.warns(FutureWarning):
                DataExecutor(_loader(), micro_batch_size=-1)
    finally:
        flags.reset()


def test_bad_arguments():
    with pytest.raises(TypeError, match="wrap the loader"):
        DataExecutor([torch.zeros(1)])
    for kwargs, match in (({"num_steps": 0}, "num_steps"), ({"activation_steps": 1.5}, "activation_steps"),
                          ({"checkpoint_steps": "often"}, "checkpoint_steps"),
                          ({"profiler_activities": [object]}, "Activity")):
        with pytest.raises((TypeError, ValueError, RuntimeError), match=match):
            DataExecutor(_loader(), **kwargs)


def test_profiler_tracks_samples_and_rates_and_runs_user_activities():
    events = []

    class Counter(cstorch.utils.profiler.Activity):
        name = "counter"

        def on_start(self):
            events.append("start")

        def on_step(self, batch, samples):
            events.append(samples)

        def on_stop(self):
            events.append("stop")

    executor = DataExecutor(_loader(n_batches=3, batch=5), num_steps=4,
                            profiler_activities=[Counter])
    for _ in executor:
        pass
    tracker = executor.profiler.rate_tracker
    assert tracker.total_samples == 20 and tracker.total_steps == 4
    assert tracker.total_time > 0 and tracker.rate > 0
    assert tracker.global_rate == pytest.approx(20 / tracker.total_time)
    assert events == ["start", 5, 5, 5, 5, "stop"]
    assert set(executor.profiler.summary()) == {"rate_tracker", "counter"}


def test_executor_state_artifact_dir_and_quiet_progress(tmp_path, capsys):
    cstorch.backend("CPU", artifact_dir=str(tmp_path))
    executor = DataExecutor(_loader(n_batches=3))
    finals = [executor.on_final_iteration for _ in executor]
    assert finals == [False, False, True]
    assert executor.artifact_dir.is_dir() and tmp_path in executor.artifact_dir.parents
    other = DataExecutor(_loader())
    assert other.artifact_dir != executor.artifact_dir
    assert capsys.readouterr().err == ""   # stderr is not a terminal here: no progress bar


def test_progress_bar_on_a_terminal_shows_steps_and_the_loss(monkeypatch):
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    steps, checkpoints = [], []
    step = _traced_step(steps, checkpoints)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    losses = [float(step(batch)) for batch in DataExecutor(_loader(), num_steps=3)]
    out = terminal.getvalue()
    assert "3/3" in out and "step" in out
    assert f"loss={losses[0]:.4g}" in out   # read after the first step, drawn at once
    # The bar left on the terminal shows the last step's loss, not the last one read
    # during the loop (at most once a second).
    assert f"{losses[-1]:.4g}" != f"{losses[0]:.4g}"
    assert f"loss={losses[-1]:.4g}" in out.rstrip().split("\r")[-1]


def test_an_executor_inside_another_hands_back_the_outer_one():
    outer = DataExecutor(_loader(), num_steps=2)
    seen = []
    for _ in outer:
        for _ in DataExecutor(_loader(), num_steps=1):
            seen.append(cstorch.current_executor().num_steps)
        seen.append(cstorch.current_executor() is outer)
    assert seen == [1, True, 1, True]
    with pytest.raises(RuntimeError, match="no DataExecutor"):
        cstorch.current_executor()
