"""Profiling as code written for the real package does it: an `Activity` subclass that
overrides `update()` is updated after every step, `profile(on_trace_ready=...)` calls the
handler with the profile, `tensorboard_trace_handler` writes the trace, and the
`ProfilerRegistry` holds the open profile."""
import gzip
import json

import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils.data import DataExecutor, DataLoader


def _loader(batches=5, batch=3):
    return DataLoader(lambda: torch.utils.data.DataLoader(range(batches * batch), batch_size=batch))


def test_a_user_activity_is_updated_after_every_step():
    class StepCounter(cstorch.utils.profiler.Activity):
        def __init__(self):
            self.count = 0
            self.seen = []

        def update(self):
            self.count += 1
            self.seen.append(cstorch.current_executor().user_iteration)

    executor = DataExecutor(_loader(), num_steps=4, profiler_activities=[StepCounter])
    for _ in executor:
        pass
    counter = executor.profiler.activities["StepCounter"]
    assert counter.count == 4 and counter.seen == [1, 2, 3, 4]
    assert executor.profiler.StepCounter is counter
    assert executor.profiler.rate_tracker.total_samples == 12


def test_on_trace_ready_gets_the_profile_when_it_closes(tmp_path):
    cstorch.backend("CPU")
    ready = []
    with cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=2, end_step=3),
                                  on_trace_ready=ready.append) as prof:
        assert cstorch.profiler.ProfilerRegistry.get_profiler() is prof
        for _ in DataExecutor(_loader(), num_steps=4):
            pass
        assert ready == []   # not before the profile closes
    assert ready == [prof]
    assert cstorch.profiler.ProfilerRegistry.get_profiler() is None
    assert [e["step"] for e in prof.events] == [2, 3]


@pytest.mark.parametrize("use_gzip", [False, True])
def test_tensorboard_trace_handler_writes_the_chrome_trace(tmp_path, use_gzip):
    cstorch.backend("CPU")
    handler = cstorch.profiler.tensorboard_trace_handler(tmp_path / "tb", worker_name="w0",
                                                         use_gzip=use_gzip)
    with cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=1, end_step=-1),
                                  on_trace_ready=handler):
        for _ in DataExecutor(_loader(), num_steps=3):
            pass
    (path,) = (tmp_path / "tb").iterdir()
    suffix = ".pt.trace.json.gz" if use_gzip else ".pt.trace.json"
    assert path.name.startswith("w0.") and path.name.endswith(suffix)
    text = gzip.decompress(path.read_bytes()).decode() if use_gzip else path.read_text()
    steps = [e["name"] for e in json.loads(text)["traceEvents"] if e["ph"] == "X"]
    assert steps == ["step 1", "step 2", "step 3"]


def test_registry_and_arguments():
    cstorch.backend("CPU")
    sched = cstorch.profiler.schedule(start_step=1, end_step=2)
    with cstorch.profiler.profile(schedule=sched):
        with pytest.raises(RuntimeError, match="already open"):
            with cstorch.profiler.profile(schedule=sched):
                pass
    with pytest.raises(TypeError):
        cstorch.profiler.schedule()
    with pytest.raises(TypeError):
        cstorch.profiler.profile()
    with pytest.raises(TypeError):
        cstorch.profiler.profile(schedule=sched, record_shapes=True)   # not silently dropped
    with pytest.raises(TypeError, match="on_trace_ready"):
        cstorch.profiler.profile(schedule=sched, on_trace_ready="trace.json")
    late = cstorch.profiler.schedule(start_step=10, end_step=12)
    with cstorch.profiler.profile(schedule=late) as prof:
        with pytest.warns(UserWarning, match="records nothing"):
            for _ in DataExecutor(_loader(), num_steps=2):
                pass
    assert prof.events == []


def test_profiler_activities_is_the_fifth_positional_parameter():
    class Noop(cstorch.utils.profiler.Activity):
        pass

    executor = DataExecutor(_loader(), 2, None, None, [Noop])
    assert "Noop" in executor.profiler.activities
    with pytest.raises(TypeError):
        DataExecutor(_loader(), 2, None, None, [Noop], None)   # cs_config is keyword-only
