"""DataExecutor(prefetch=True): the next batch read while the step runs, never across a
checkpoint step or past the run, and the same training. On the CPU backend the batches
stay the loader's host tensors; on accelerators they are uploaded as device tensors, a
path these tests take on the CPU by making the executor upload (`uploads` fixture)."""
import pytest
import torch

import cerebras.pytorch as cstorch
import cstorch.utils.data.executor as executor_module
from bridge.device_tensor import DeviceTensor
from cerebras.pytorch.utils.data import DataExecutor, DataLoader
from tests.models import classifier_step


@pytest.fixture(params=["host", "upload"])
def uploads(request, monkeypatch):
    """Whether prefetched batches are uploaded: as on the CPU (no), or as on an accelerator."""
    if request.param == "upload":
        monkeypatch.setattr(executor_module, "_uploads", lambda mesh: True)
    return request.param == "upload"


def _host(t):
    return t.host() if isinstance(t, DeviceTensor) else t


def _data(n=6):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, generator=g), torch.randint(0, 2, (4,), generator=g))
            for _ in range(n)]


class _Counted:
    """An iterable over `data` that counts the batches taken from it."""

    def __init__(self, data, fail_at=None, with_state=False):
        self.data, self.taken, self.fail_at = data, 0, fail_at
        if with_state:
            self.state_dict = lambda: {"taken": self.taken}

    def __iter__(self):
        for batch in self.data:
            if self.taken == self.fail_at:
                raise ValueError("bad batch")
            self.taken += 1
            yield batch


def _step():
    cstorch.backend("CPU")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    step = classifier_step(compiled, optimizer)
    return step


def test_prefetched_batches_have_the_same_values_and_training(uploads):
    data = _data()
    plain = _step()
    expected = [float(plain(x, y)) for x, y in DataExecutor(DataLoader(lambda: data))]
    step = _step()
    losses = []
    for i, (x, y) in enumerate(DataExecutor(DataLoader(lambda: data), prefetch=True)):
        if uploads:
            assert isinstance(x, DeviceTensor) and isinstance(y, DeviceTensor)
            assert y.dtype == torch.int64
            assert torch.equal(x.host(), data[i][0]) and torch.equal(y.host(), data[i][1])
        else:   # the loader's own tensors: no copy on the host
            assert x is data[i][0] and y is data[i][1]
        losses.append(float(step(x, y)))
    assert losses == expected
    assert step.captures == 1


def test_the_next_batch_is_read_once_a_step_is_dispatched_but_not_after_a_checkpoint_step(uploads):
    step, source = _step(), _Counted(_data())
    executor = DataExecutor(DataLoader(lambda: source), num_steps=6, checkpoint_steps=3,
                            prefetch=True)
    taken = []
    for x, y in executor:
        before = source.taken
        step(x, y)
        taken.append((before, source.taken))
    # read ahead after steps 1, 2, 4, 5; not after the checkpoint step 3 nor the last one
    assert taken == [(1, 2), (2, 3), (3, 3), (4, 5), (5, 6), (6, 6)]


def test_a_loader_that_saves_its_position_is_not_read_ahead_without_checkpoint_steps(uploads):
    step, source = _step(), _Counted(_data(), with_state=True)
    for x, y in DataExecutor(DataLoader(lambda: source), num_steps=5, prefetch=True):
        step(x, y)
        assert source.taken == cstorch.current_executor().user_iteration


def test_a_batch_read_ahead_and_left_unused_starts_the_next_executor(uploads):
    step, data = _step(), _data()
    loader = DataLoader(lambda: data)
    seen = []
    for x, y in DataExecutor(loader, num_steps=6, prefetch=True):
        seen.append(_host(x))
        step(x, y)
        if len(seen) == 2:
            break   # batch 3 was read ahead
    for x, _y in DataExecutor(loader, num_steps=2):
        seen.append(x)
    assert all(torch.equal(a, b[0]) for a, b in zip(seen, data[:4]))


def test_a_loader_error_while_reading_ahead_is_raised_where_the_loop_asks_for_the_batch(uploads):
    step, source = _step(), _Counted(_data(), fail_at=2)
    done = []
    with pytest.raises(ValueError, match="bad batch"):
        for x, y in DataExecutor(DataLoader(lambda: source), num_steps=4, prefetch=True):
            step(x, y)   # the read ahead after step 2 fails: not here
            done.append(cstorch.current_executor().user_iteration)
    assert done == [1, 2]


def test_prefetch_on_a_backend_that_does_not_execute_warns_and_reads_lazily():
    cstorch.backend("CSX", compile_only=True)
    loader = _Counted(_data(3))
    executor = DataExecutor(DataLoader(lambda: loader), num_steps=3, prefetch=True)
    with pytest.warns(UserWarning, match=r"prefetch=True\) has no effect here: the backend "
                                         r"does not execute steps"):
        batches = iter(executor)
        first = next(batches)
    assert not isinstance(first[0], DeviceTensor) and loader.taken == 1


def _uneven():
    """Batches of 4, 3, 2, 4, 3, 2 samples: a count taken from the wrong batch shows."""
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(n, 3, generator=g), torch.randint(0, 2, (n,), generator=g))
            for n in (4, 3, 2, 4, 3, 2)]


@pytest.mark.parametrize("prefetch", [False, True])
def test_the_rate_tracker_counts_each_batchs_own_samples(prefetch, uploads):
    # The executor counts a step's samples from what the worker counted when it read the
    # batch (a read-ahead batch keeps its own count); a batch left unused by an earlier
    # executor is counted by the next one.
    step, data = _step(), _uneven()
    loader = DataLoader(lambda: data)
    first = DataExecutor(loader, num_steps=6, prefetch=prefetch)
    for i, (x, y) in enumerate(first):
        step(x, y)
        if i == 1:
            break
    # a step is counted once its body has run: the break leaves the second one out
    assert first.profiler.rate_tracker.total_samples == 4
    second = DataExecutor(loader, num_steps=4, prefetch=prefetch)
    for x, y in second:
        step(x, y)
    # with prefetch the third batch (2 samples) was read ahead; it is the second run's first
    assert second.profiler.rate_tracker.total_samples == 2 + 4 + 3 + 2
    assert second.profiler.rate_tracker.total_steps == 4
