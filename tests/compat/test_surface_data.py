"""cstorch.utils.data (DistributedSampler, sampler.pad_index, compute_num_steps,
data_executor.MbsSetting), cstorch.profiler, and the storage names Model Zoo uses
(constants.__CSTORCH_VERSION__, serializers.cache_deferred_tensors / use_external_link)."""
import json
import os

import h5py
import pytest
import torch

import cerebras.pytorch as cstorch
from cerebras.pytorch.utils.data import DistributedSampler, compute_num_steps
from cerebras.pytorch.utils.data.data_executor import MbsSetting
from cerebras.pytorch.utils.data.sampler import pad_index
from cstorch.utils.data.workers import Layout


class Numbers(torch.utils.data.Dataset):
    """Sample i is i; the pad index gives -100."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor(-100 if i == pad_index else i)


def _batches(sampler):
    return [list(b) for b in sampler]


def test_sampler_batches_pads_and_drops_like_the_flags_say():
    ds = Numbers(10)
    plain = DistributedSampler(ds, shuffle=False, batch_size=4, drop_last=False)
    assert _batches(plain) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(plain) == 3
    dropped = DistributedSampler(ds, shuffle=False, batch_size=4, drop_last=True)
    assert _batches(dropped) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    padded = DistributedSampler(ds, shuffle=False, batch_size=4, drop_last=False, pad_last=True)
    assert _batches(padded)[-1] == [8, 9, pad_index, pad_index]
    loader = torch.utils.data.DataLoader(ds, batch_sampler=padded)
    assert torch.equal(list(loader)[-1], torch.tensor([8, 9, -100, -100]))
    longer = DistributedSampler(ds, shuffle=False, batch_size=4, num_samples=14)
    assert _batches(longer) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    assert list(DistributedSampler(ds, shuffle=False, num_samples=3)) == [0, 1, 2]


def test_sampler_shuffles_deterministically_per_epoch():
    ds = Numbers(12)
    a = DistributedSampler(ds, shuffle=True, seed=7, batch_size=3)
    b = DistributedSampler(ds, shuffle=True, seed=7, batch_size=3)
    first, again = _batches(a), _batches(b)
    assert first == again and sorted(sum(first, [])) == list(range(12))
    assert first != [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    second = _batches(a)                              # the next epoch: another order
    assert second != first and sorted(sum(second, [])) == list(range(12))
    # Restart after 5 batches (15 samples): epoch 1, its second batch onwards.
    c = DistributedSampler(ds, shuffle=True, seed=7, batch_size=3)
    c.set_state(15)
    assert _batches(c) == second[1:]
    assert _batches(DistributedSampler(ds, shuffle=True, seed=7, batch_size=3,
                                       start_index=6)) == first[2:]


def test_sharded_streams_join_into_the_unsharded_order():
    cstorch.backend("CSX")
    ds = Numbers(24)

    def input_fn():
        sampler = DistributedSampler(ds, shuffle=True, seed=1, batch_size=2)
        return torch.utils.data.DataLoader(ds, batch_sampler=sampler)

    loader = cstorch.utils.data.DataLoader(input_fn)
    loader.use_layout(Layout(num_csx=2, num_workers_per_csx=3))
    workers = loader.workers()
    assert [len(w.loader.batch_sampler) for w in workers] == [2] * 6
    steps = [loader.next_batch() for _ in range(6)]
    expected = sum(_batches(DistributedSampler(ds, shuffle=True, seed=1, batch_size=2)), [])
    assert torch.cat(steps).tolist() == expected
    cstorch.backend("CPU")      # outside streaming workers the sampler is not sharded
    assert len(DistributedSampler(ds, batch_size=2)) == 12


def test_compute_num_steps_follows_steps_epochs_and_max_steps():
    loader = cstorch.utils.data.DataLoader(lambda: torch.utils.data.DataLoader(range(40),
                                                                                batch_size=4))
    cstorch.backend("CPU")
    assert compute_num_steps(loader) == 10
    assert compute_num_steps(loader, num_steps=7, max_steps=3) == 7
    assert compute_num_steps(loader, max_steps=25, initial_step=5) == 20
    assert compute_num_steps(loader, num_epochs=3) == 30
    assert compute_num_steps(loader, num_epochs=3, steps_per_epoch=4) == 12
    assert compute_num_steps(loader, num_epochs=3, max_steps=12, initial_step=2) == 10
    assert compute_num_steps(loader, num_epochs=2, grad_accum_steps=3) == 6
    with pytest.raises(ValueError, match="mutually exclusive"):
        compute_num_steps(loader, num_steps=2, num_epochs=1)
    with pytest.raises(ValueError, match="exceeds"):
        compute_num_steps(loader, num_epochs=1, steps_per_epoch=11)
    with pytest.raises(ValueError, match="no steps"):
        compute_num_steps(loader, max_steps=5, initial_step=5)
    with pytest.raises(ValueError, match="no length"):
        compute_num_steps(iter(range(3)))
    assert "auto" in str(MbsSetting) and "explore" in str(MbsSetting)


def test_profile_records_the_scheduled_steps_of_executor_runs(tmp_path):
    cstorch.backend("CPU")
    loader = cstorch.utils.data.DataLoader(lambda: torch.utils.data.DataLoader(range(24),
                                                                                batch_size=4))
    schedule = cstorch.profiler.schedule(start_step=2, end_step=4)
    with cstorch.profiler.profile(schedule=schedule, host_activities=["ACT-0"]) as prof:
        for _ in cstorch.utils.data.DataExecutor(loader, num_steps=5):
            pass
        for _ in cstorch.utils.data.DataExecutor(loader, num_steps=2):
            pass
    for _ in cstorch.utils.data.DataExecutor(loader, num_steps=3):   # after the block: not seen
        pass
    assert [(e["run"], e["step"], e["samples"]) for e in prof.events] == [
        (1, 2, 4), (1, 3, 4), (1, 4, 4), (2, 2, 4)]
    assert all(e["duration_s"] >= 0 for e in prof.events)
    assert prof.appliance_response is None and prof.host_activities == ["ACT-0"]
    prof.export_chrome_trace(tmp_path / "trace" / "chrome_trace.json")
    trace = json.loads((tmp_path / "trace" / "chrome_trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in complete] == ["step 2", "step 3", "step 4", "step 2"]
    assert {e["tid"] for e in complete} == {1, 2}
    summary = prof.get_summary()
    assert summary.splitlines()[0].split()[:2] == ["run", "steps"] and len(summary.splitlines()) == 3
    with pytest.raises(ValueError):
        cstorch.profiler.schedule(start_step=5, end_step=2)
    assert 7 in cstorch.profiler.schedule(start_step=-1, end_step=-1) and 1 not in schedule


def test_checkpoint_version_key_and_deferred_tensor_switches(tmp_path):
    cstorch.backend("CPU")
    state = {"w": torch.randn(64, 64), "b": torch.arange(5.0), "step": 3}
    first = tmp_path / "first.mdl"
    cstorch.save(state, first)
    with h5py.File(first, "r") as f:
        assert f.attrs[cstorch.storage.constants.__CSTORCH_VERSION__] == cstorch.__version__

    with cstorch.storage.serializers.cache_deferred_tensors(True):
        cached = cstorch.load(first)
    with cstorch.storage.serializers.cache_deferred_tensors(False):
        uncached = cstorch.load(first, map_location="cache")
    assert torch.equal(cached["w"] + 0, state["w"]) and cached["w"].is_materialized
    assert torch.equal(uncached["w"] + 0, state["w"]) and not uncached["w"].is_materialized

    loaded = cstorch.load(first)
    loaded["trainer"] = {"epoch": 2}
    linked, copied = tmp_path / "linked.mdl", tmp_path / "copied.mdl"
    with cstorch.storage.serializers.use_external_link(True):
        cstorch.save(loaded, linked)
    cstorch.save(cstorch.load(first), copied)
    with h5py.File(linked, "r") as f:
        link = f.get("w", getlink=True)
        assert isinstance(link, h5py.ExternalLink) and link.path == "w"
        assert os.path.samefile(link.filename, first)
    assert os.path.getsize(linked) < os.path.getsize(copied) - 10_000
    again = cstorch.load(linked)
    assert torch.equal(again["w"] + 0, state["w"]) and torch.equal(again["b"] + 0, state["b"])
    assert again["step"] == 3 and again["trainer"] == {"epoch": 2}
