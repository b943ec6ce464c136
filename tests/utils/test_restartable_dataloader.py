"""The RestartableDataLoader protocol, get_worker_state, streaming workers, and a
training run resumed from a checkpoint that reproduces the uninterrupted run."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils.data import (DataExecutor, DataLoader, DataLoaderCheckpoint,
                                         RestartableDataLoader)
from cstorch.utils.data.workers import Layout


class ShuffledLoader:
    """A restartable loader over `samples` in a seeded order, sharded over the streaming
    workers: worker r of n takes every n-th sample of each epoch's permutation."""

    def __init__(self, samples, batch_size, seed=0):
        self.samples, self.batch_size, self.seed = samples, batch_size, seed
        dist = cstorch.distributed
        self.rank = dist.get_streaming_rank() if dist.is_streamer() else 0
        self.world = dist.num_streamers() if dist.is_streamer() else 1
        self.position = 0          # batches this worker streamed over all runs
        self.start = 0             # where this run started
        self.seen_states = []

    def _order(self, epoch):
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.samples), generator=g)[self.rank::self.world]

    def __iter__(self):
        per_epoch = len(self._order(0)) // self.batch_size
        while True:
            epoch, index = divmod(self.position, per_epoch)
            order = self._order(epoch)[index * self.batch_size:(index + 1) * self.batch_size]
            self.position += 1
            yield self.samples[order]

    def state_dict(self):
        state = cstorch.distributed.get_worker_state()
        self.seen_states.append(state)
        return {"batches": self.start + state.worker_step, "worker": state.global_worker_id}

    def load_state_dict(self, state_dict, strict=True):
        self.position = self.start = state_dict[f"worker_{self.rank}"]["batches"]

    def aggregate_state_dict(self, worker_states):
        return {f"worker_{s['worker']}": s for s in worker_states}

    def deaggregate_state_dict(self, aggregated_state_dict, strict=True):
        return aggregated_state_dict


def _samples(n=48):
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(5))


def test_protocol_is_structural():
    assert isinstance(ShuffledLoader(_samples(), 4), RestartableDataLoader)
    assert not isinstance(torch.utils.data.DataLoader([1, 2]), RestartableDataLoader)


def test_get_worker_state_only_inside_state_dict():
    with pytest.raises(RuntimeError, match="only be called inside the state_dict"):
        cstorch.distributed.get_worker_state()
    assert not cstorch.distributed.is_streamer()
    with pytest.raises(RuntimeError, match="not a streaming worker"):
        cstorch.distributed.get_streaming_rank()


def _take(loader, n):
    return [loader.next_batch() for _ in range(n)]


def test_single_worker_resumes_at_the_next_sample():
    cstorch.backend("CPU")
    samples = _samples()
    full = DataLoader(ShuffledLoader, samples, 4)
    expected = _take(full, 20)           # crosses two epochs of 12 batches

    first = DataLoader(ShuffledLoader, samples, 4)
    _take(first, 7)
    state = first.state_dict()
    (worker_state,) = first.dataloader.seen_states
    assert worker_state == DataLoaderCheckpoint(
        global_worker_id=0, local_worker_id=0, total_num_workers=1, num_workers_per_csx=1,
        num_csx=1, wse_id=0, appliance_step=7, worker_step=7, samples_streamed=28)
    resumed = DataLoader(ShuffledLoader, samples, 4)
    resumed.load_state_dict(state)
    got = _take(resumed, 13)
    assert all(torch.equal(a, b) for a, b in zip(got, expected[7:]))
    # counters start again in the restored run; the loader adds its own offset
    _take(resumed, 1)
    assert resumed.state_dict() == {"worker_0": {"batches": 21, "worker": 0}}


class NoStrictLoader(ShuffledLoader):
    """The protocol's load and deaggregate methods without `strict`, as Model Zoo's HDF5
    iterable data processors define them."""

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)

    def deaggregate_state_dict(self, aggregated_state_dict):
        return aggregated_state_dict


def test_a_loader_whose_methods_take_no_strict_resumes():
    cstorch.backend("CPU")
    samples = _samples()
    expected = _take(DataLoader(NoStrictLoader, samples, 4), 10)
    first = DataLoader(NoStrictLoader, samples, 4)
    _take(first, 4)
    resumed = DataLoader(NoStrictLoader, samples, 4)
    resumed.load_state_dict(first.state_dict(), strict=False)
    assert all(torch.equal(a, b) for a, b in zip(_take(resumed, 6), expected[4:]))


@pytest.mark.parametrize("stop", [6, 7, 8])
def test_several_workers_per_system_resume_deterministically(stop, tmp_path):
    cstorch.backend("CSX", artifact_dir=str(tmp_path),
                    cluster_config=cstorch.utils.CSConfig(num_workers_per_csx=3))
    samples = _samples()
    full = DataLoader(ShuffledLoader, samples, 2)
    assert [w.loader.rank for w in full.workers()] == [0, 1, 2]
    expected = _take(full, 20)
    # round-robin: step i comes from worker i % 3, each walking its own shard
    shards = [ShuffledLoader(samples, 2) for _ in range(3)]
    for r, s in enumerate(shards):
        s.rank, s.world = r, 3
    iters = [iter(s) for s in shards]
    assert all(torch.equal(expected[i], next(iters[i % 3])) for i in range(20))

    first = DataLoader(ShuffledLoader, samples, 2)
    _take(first, stop)
    state = first.state_dict()
    steps = [st.worker_step for w in first.workers() for st in w.loader.seen_states]
    assert steps == [len(range(r, stop, 3)) for r in range(3)]
    assert {st.appliance_step for w in first.workers() for st in w.loader.seen_states} == {stop}
    assert [w.loader.seen_states[0].samples_streamed for w in first.workers()] == \
        [2 * s for s in steps]

    resumed = DataLoader(ShuffledLoader, samples, 2)
    resumed.load_state_dict(state)
    got = _take(resumed, 20 - stop)
    assert all(torch.equal(a, b) for a, b in zip(got, expected[stop:]))
    cstorch.backend("CPU")


def test_systems_batches_are_joined_along_the_batch_dimension():
    cstorch.backend("CPU")

    calls = []

    def input_fn():   # each worker's loader is told apart by when it was built
        calls.append(None)
        return [torch.full((2, 1), 10.0 * len(calls) + i) for i in range(3)]

    loader = DataLoader(input_fn)
    loader.use_layout(Layout(num_csx=2, num_workers_per_csx=1))
    batch = loader.next_batch()
    assert batch.shape == (4, 1)
    assert batch[:, 0].tolist() == [10.0, 10.0, 20.0, 20.0]   # system 0's, then system 1's
    with pytest.raises(RuntimeError, match="already streams with 2 system"):
        loader.use_layout(Layout())


def test_loaders_without_the_protocol():
    cstorch.backend("CPU")
    loader = DataLoader(lambda: [torch.zeros(2)] * 3)
    with pytest.warns(UserWarning, match="position is not saved"):
        assert loader.state_dict() == {}
    with pytest.raises(RuntimeError, match="no load_state_dict"):
        loader.load_state_dict({"batches": 3})
    loader.load_state_dict({"batches": 3}, strict=False)
    with pytest.raises(TypeError, match="expects the dict"):
        loader.load_state_dict([1])


def _run(steps, ckpt_path=None, resume_from=None, stop_after=None):
    """Train a small model; checkpoint (model, optimizer, scheduler, loader) every 4 steps."""
    cstorch.backend("CPU")
    torch.manual_seed(0 if resume_from is None else 123)   # a resumed run starts elsewhere
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = cstorch.optim.lr_scheduler.StepLR(optimizer, initial_learning_rate=0.1,
                                                 step_size=3, gamma=0.5)
    loader = DataLoader(ShuffledLoader, _samples(), 4)
    if resume_from is not None:
        state = cstorch.load(resume_from)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        loader.load_state_dict(state["dataloader"])

    @cstorch.checkpoint_closure
    def save(step):
        cstorch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                      "scheduler": scheduler.state_dict(), "dataloader": loader.state_dict()},
                     f"{ckpt_path}_{step}.mdl")

    @cstorch.trace
    def step(batch):
        loss = F.mse_loss(compiled(batch), batch.sum(1, keepdim=True).sin())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        return loss

    losses = []
    executor = DataExecutor(loader, num_steps=steps, checkpoint_steps=4)
    for batch in executor:
        losses.append(step(batch).item())
        if ckpt_path is not None:
            save(executor.user_iteration)
    return losses


def test_resumed_training_reproduces_the_uninterrupted_losses(tmp_path):
    uninterrupted = _run(16, ckpt_path=tmp_path / "a")
    assert len(set(uninterrupted)) == 16
    resumed = _run(8, resume_from=f"{tmp_path / 'a'}_8.mdl")
    assert resumed == uninterrupted[8:]       # exactly: same programs, same inputs
