"""`cstorch.utils.benchmark.benchmark_dataloader`: epochs, steps and sampled steps are
counted as documented, timings and rates follow the clock exactly, batch structures are
tallied, an interruption returns partial metrics, and bad arguments are refused."""
import mmap
import time
from collections import OrderedDict
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.utils.benchmark.utils import dataloader as bench

MS = 10**6


class Pair(NamedTuple):
    a: object
    b: object


class Loader:
    """An iterable of ``batches`` that counts iterator creations and batches drawn, can
    advance a fake clock and can raise KeyboardInterrupt at a chosen (epoch, step)."""

    def __init__(self, batches, clock=None, creation_ms=0, step_ms=0, interrupt_at=None):
        self.batches = batches
        self.clock, self.creation_ms, self.step_ms = clock, creation_ms, step_ms
        self.interrupt_at = interrupt_at
        self.iters = 0
        self.drawn = 0

    def __iter__(self):
        self.iters += 1
        if self.clock is not None:
            self.clock.advance(self.creation_ms)
        if self.interrupt_at == (self.iters, 0):
            raise KeyboardInterrupt
        return self._epoch(self.iters)

    def _epoch(self, epoch):
        for step, batch in enumerate(self.batches, 1):
            if self.interrupt_at == (epoch, step):
                raise KeyboardInterrupt
            if self.clock is not None:
                self.clock.advance(self.step_ms)
            self.drawn += 1
            yield batch


class FakeClock:
    def __init__(self):
        self.now = 10**12

    def advance(self, ms):
        self.now += ms * MS

    def perf_counter_ns(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(bench, "time",
                        SimpleNamespace(perf_counter_ns=fake.perf_counter_ns,
                                        time_ns=time.time_ns))
    return fake


def _batches(n, batch_size=4):
    return [{"x": torch.randn(batch_size, 3), "y": torch.arange(batch_size)} for _ in range(n)]


def _sampled(metrics):
    return [(b.epoch_step, b.global_step) for e in metrics.epoch_metrics for b in e.batch_metrics]


def test_importable_from_the_cerebras_alias():
    from cerebras.pytorch.utils.benchmark import benchmark_dataloader
    from cerebras.pytorch.utils.benchmark.utils.dataloader import (
        BatchMetrics, BatchSpec, BatchSpecOccurence, EpochMetrics, Metrics)

    assert benchmark_dataloader is bench.benchmark_dataloader
    assert Metrics is bench.Metrics and EpochMetrics is bench.EpochMetrics
    assert cstorch.utils.benchmark.utils.dataloader.BatchMetrics is BatchMetrics
    assert {BatchSpec, BatchSpecOccurence} == {bench.BatchSpec, bench.BatchSpecOccurence}
    assert "benchmark" in cstorch.utils.__all__


def test_dataclass_defaults_and_properties():
    before = time.time_ns()
    m = bench.Metrics()
    assert m.is_partial is True and m.global_rate == 0.0 and m.end_time_ns == 0
    assert m.total_time == np.timedelta64(0, "ns") and isinstance(m.total_time, np.timedelta64)
    assert m.dataloader_build_time == np.timedelta64(0, "ns")
    assert m.epoch_metrics == [] and m.batch_specs == {}
    assert before <= m.start_time_ns <= time.time_ns()
    assert m.total_steps == 0 and m.global_sample_rate is None

    e = bench.EpochMetrics(iterator_creation=np.timedelta64(3, "ms"),
                           iteration_time=np.timedelta64(40, "ms"), total_steps=7)
    assert e.total_time == np.timedelta64(43, "ms")
    assert e.end_time_ns == 0 and e.batch_metrics == [] and isinstance(e.start_time_ns, int)
    m.epoch_metrics = [e, bench.EpochMetrics(total_steps=5)]
    assert m.total_steps == 12

    b = bench.BatchMetrics(epoch_step=1, global_step=2, local_rate=3.0, global_rate=4.0)
    assert b.profile_activities == {} and isinstance(b.sampling_time_ns, int)
    assert bench.BatchSpecOccurence(epoch=1, epoch_step=2, global_step=3).count == 1


def test_epochs_and_steps_are_counted(capsys):
    loader = Loader(_batches(10))
    calls = []
    m = cstorch.utils.benchmark.benchmark_dataloader(
        lambda: calls.append(1) or loader, num_epochs=3, print_metrics=False)
    assert calls == [1] and loader.iters == 3
    assert [e.total_steps for e in m.epoch_metrics] == [10, 10, 10]
    assert m.total_steps == 30 and m.is_partial is False
    assert capsys.readouterr().out == ""


def test_defaults_are_one_whole_epoch_sampled_every_100_steps():
    loader = Loader(_batches(250, batch_size=1))
    m = bench.benchmark_dataloader(lambda: loader, print_metrics=False)
    assert loader.iters == 1 and m.total_steps == 250
    assert _sampled(m) == [(1, 1), (100, 100), (200, 200)]


def test_steps_per_epoch_caps_each_epoch_without_drawing_more():
    loader = Loader(_batches(10))
    m = bench.benchmark_dataloader(lambda: loader, num_epochs=2, steps_per_epoch=4,
                                   print_metrics=False)
    assert [e.total_steps for e in m.epoch_metrics] == [4, 4]
    assert loader.drawn == 8
    short = bench.benchmark_dataloader(lambda: Loader(_batches(3)), steps_per_epoch=50,
                                       print_metrics=False)
    assert short.total_steps == 3 and short.is_partial is False


def test_sampled_steps_restart_each_epoch():
    m = bench.benchmark_dataloader(lambda: Loader(_batches(10)), num_epochs=2,
                                   sampling_frequency=3, print_metrics=False)
    assert _sampled(m) == [(1, 1), (3, 3), (6, 6), (9, 9),
                           (1, 11), (3, 13), (6, 16), (9, 19)]
    every = bench.benchmark_dataloader(lambda: Loader(_batches(3)), sampling_frequency=1,
                                       print_metrics=False)
    assert _sampled(every) == [(1, 1), (2, 2), (3, 3)]


def test_times_and_rates_follow_the_clock(clock):
    loader = Loader(_batches(5), clock=clock, creation_ms=5, step_ms=10)

    def input_fn():
        clock.advance(2)
        return loader

    m = bench.benchmark_dataloader(input_fn, num_epochs=2, sampling_frequency=2,
                                   print_metrics=False)
    assert m.dataloader_build_time == np.timedelta64(2, "ms")
    for e in m.epoch_metrics:
        assert isinstance(e.iterator_creation, np.timedelta64)
        assert e.iterator_creation == np.timedelta64(5, "ms")
        assert e.iteration_time == np.timedelta64(50, "ms")
        assert e.total_time == np.timedelta64(55, "ms")
    assert m.total_time == np.timedelta64(110, "ms")
    assert m.global_rate == pytest.approx(10 / 0.110)
    # Every batch takes 10 ms after the previous one (or after iterator creation).
    rates = [(b.global_step, b.local_rate, b.global_rate)
             for e in m.epoch_metrics for b in e.batch_metrics]
    elapsed_ms = {1: 15, 2: 25, 4: 45, 6: 55 + 15, 7: 55 + 25, 9: 55 + 45}
    assert [g for g, _, _ in rates] == [1, 2, 4, 6, 7, 9]
    for global_step, local, overall in rates:
        assert local == pytest.approx(100.0)
        assert overall == pytest.approx(global_step / (elapsed_ms[global_step] / 1000))
    assert m.global_sample_rate == pytest.approx(m.global_rate * 4)


def test_wall_clock_stamps_are_ordered_ints():
    m = bench.benchmark_dataloader(lambda: Loader(_batches(3)), num_epochs=2,
                                   print_metrics=False)
    stamps = [m.start_time_ns]
    for e in m.epoch_metrics:
        stamps += [e.start_time_ns] + [b.sampling_time_ns for b in e.batch_metrics]
        stamps.append(e.end_time_ns)
    stamps.append(m.end_time_ns)
    assert all(isinstance(s, int) for s in stamps)
    assert stamps == sorted(stamps) and m.start_time_ns < m.end_time_ns


def test_batch_specs_tally_each_structure():
    full = {"x": torch.randn(4, 3), "y": torch.arange(4)}
    last = {"x": torch.randn(2, 3), "y": torch.arange(2)}
    m = bench.benchmark_dataloader(lambda: Loader([full, full, full, last]), num_epochs=2,
                                   print_metrics=False)
    specs = m.batch_specs
    assert len(specs) == 2
    full_spec, last_spec = bench.BatchSpec.from_batch(full), bench.BatchSpec.from_batch(last)
    assert (specs[full_spec].count, specs[full_spec].epoch, specs[full_spec].epoch_step,
            specs[full_spec].global_step) == (6, 1, 1, 1)
    assert (specs[last_spec].count, specs[last_spec].epoch, specs[last_spec].epoch_step,
            specs[last_spec].global_step) == (2, 1, 4, 4)
    assert m.global_sample_rate is None


def test_batch_spec_compares_structure_shapes_and_dtypes_not_values():
    spec = bench.BatchSpec.from_batch
    a = {"x": torch.randn(4, 3), "y": [torch.zeros(4, dtype=torch.int64), 7]}
    same = {"x": torch.randn(4, 3), "y": [torch.ones(4, dtype=torch.int64), 9]}
    assert spec(a) == spec(same) and hash(spec(a)) == hash(spec(same))
    assert spec(a).batch_size == 4
    assert spec(a) != spec({"x": torch.randn(4, 3, dtype=torch.float64), "y": a["y"]})
    assert spec(a) != spec({"x": torch.randn(4, 2), "y": a["y"]})
    assert spec(a) != spec({"x": a["x"], "y": tuple(a["y"])})
    assert spec(a) != spec({"y": a["y"], "x": a["x"]})
    assert spec(a) != spec(OrderedDict(a))
    assert spec((a["x"], a["x"])) != spec(Pair(a["x"], a["x"]))
    assert spec(Pair(a["x"], a["x"])).keys == ("a", "b")
    assert spec(np.zeros((2, 5), np.float32)) == spec(np.ones((2, 5), np.float32))
    assert spec(np.zeros((2, 5), np.float32)).dtype == np.dtype("float32")
    assert spec([torch.zeros(4, 1), torch.zeros(3)]).batch_size is None
    assert spec([torch.tensor(1.0)]).batch_size is None
    assert str(spec(Pair(torch.zeros(2, 3), [1]))) == (
        "Pair(a=Tensor(shape=[2, 3], dtype=torch.float32), b=[int])")


def test_synthetic_dataset_through_a_torch_dataloader():
    data = cstorch.utils.data.SyntheticDataset(
        {"x": torch.randn(3), "i": lambda i: torch.tensor(i)}, num_samples=10)
    ragged = bench.benchmark_dataloader(
        lambda: torch.utils.data.DataLoader(data, batch_size=4), print_metrics=False)
    assert ragged.total_steps == 3 and len(ragged.batch_specs) == 2
    assert ragged.global_sample_rate is None
    even = bench.benchmark_dataloader(
        lambda: torch.utils.data.DataLoader(data, batch_size=4, drop_last=True),
        print_metrics=False)
    assert even.total_steps == 2 and len(even.batch_specs) == 1
    assert even.global_sample_rate == pytest.approx(4 * even.global_rate)
    infinite = cstorch.utils.data.SyntheticDataset({"x": torch.randn(3)})
    endless = bench.benchmark_dataloader(
        lambda: torch.utils.data.DataLoader(infinite, batch_size=2), num_epochs=2,
        steps_per_epoch=7, print_metrics=False)
    assert [e.total_steps for e in endless.epoch_metrics] == [7, 7]


def _interruptible(*args, **kwargs):
    # An escaped KeyboardInterrupt would stop the whole pytest session instead of failing.
    try:
        return bench.benchmark_dataloader(*args, **kwargs)
    except KeyboardInterrupt:
        pytest.fail("benchmark_dataloader let the KeyboardInterrupt escape")


def test_interruption_mid_epoch_returns_partial_metrics(clock, capsys):
    loader = Loader(_batches(10), clock=clock, creation_ms=1, step_ms=10,
                    interrupt_at=(2, 5))
    m = _interruptible(lambda: loader, num_epochs=3, sampling_frequency=2)
    assert m.is_partial is True
    assert [e.total_steps for e in m.epoch_metrics] == [10, 4]
    assert m.total_steps == 14
    assert _sampled(m)[-2:] == [(2, 12), (4, 14)]
    interrupted = m.epoch_metrics[1]
    assert interrupted.iteration_time == np.timedelta64(40, "ms")
    assert interrupted.end_time_ns > 0 and m.end_time_ns > 0
    assert m.total_time == np.timedelta64(101 + 41, "ms")
    assert m.global_rate == pytest.approx(14 / 0.142)
    assert "partial (interrupted)" in capsys.readouterr().out


def test_interruption_before_any_batch():
    def input_fn():
        raise KeyboardInterrupt

    m = _interruptible(input_fn, print_metrics=False)
    assert m.is_partial is True and m.epoch_metrics == [] and m.total_steps == 0
    assert m.global_rate == 0.0 and m.end_time_ns >= m.start_time_ns

    during_iter = _interruptible(lambda: Loader(_batches(2), interrupt_at=(2, 0)),
                                 num_epochs=3, print_metrics=False)
    assert during_iter.is_partial is True
    assert [e.total_steps for e in during_iter.epoch_metrics] == [2, 0]
    assert during_iter.epoch_metrics[1].end_time_ns > 0


def test_printed_report(capsys):
    bench.benchmark_dataloader(lambda: Loader(_batches(5)), num_epochs=2, sampling_frequency=2,
                               profile_activities=["memory"])
    out = capsys.readouterr().out
    assert "Dataloader benchmark: complete" in out
    assert "Total steps: 10" in out
    assert "samples/s" in out
    assert "Tensor(shape=[4, 3], dtype=torch.float32)" in out
    assert "MiB" in out
    # One row per sampled step: 1, 2, 4 in each of the two epochs.
    sampled_rows = out.split("Sampled steps")[1].split("Batch specs")[0].strip().splitlines()
    assert len(sampled_rows) == 2 + 6


def test_memory_activity_tracks_allocations():
    held = []

    def grow():
        for _ in range(3):
            # 16 MiB of new pages, touched: mapped afresh, not heap memory that earlier
            # tests freed and the allocator kept resident (which would not grow the RSS).
            block = mmap.mmap(-1, 16 * 2**20)
            block.write(b"\x01" * len(block))
            held.append(block)
            yield torch.zeros(1)

    m = bench.benchmark_dataloader(grow, sampling_frequency=1, print_metrics=False,
                                   profile_activities=["memory", "peak_memory", "memory"])
    samples = m.epoch_metrics[0].batch_metrics
    assert all(set(b.profile_activities) == {"memory", "peak_memory"} for b in samples)
    memory = [b.profile_activities["memory"] for b in samples]
    assert all(isinstance(v, int) and v > 2**20 for v in memory)
    assert memory[2] - memory[0] >= 24 * 2**20
    assert all(b.profile_activities["peak_memory"] >= b.profile_activities["memory"]
               for b in samples)


def test_unknown_profile_activity_lists_the_supported_ones():
    with pytest.raises(ValueError, match="unknown profile activity 'gpu'; the supported "
                                         "activities are 'memory', 'peak_memory'"):
        bench.benchmark_dataloader(lambda: [], profile_activities=["gpu"])
    with pytest.raises(TypeError, match=r"list of activity names, e\.g\. \['memory'\]"):
        bench.benchmark_dataloader(lambda: [], profile_activities="memory")


def test_input_fn_errors():
    with pytest.raises(TypeError, match="input_fn must be a function.*got list"):
        bench.benchmark_dataloader([torch.zeros(1)])
    with pytest.raises(TypeError, match="input_fn must return an iterable dataloader, "
                                        "it returned int"):
        bench.benchmark_dataloader(lambda: 42, print_metrics=False)


@pytest.mark.parametrize("name, bad, error, message", [
    ("num_epochs", 0, ValueError, "num_epochs must be a positive int or None, got 0"),
    ("steps_per_epoch", -3, ValueError, "steps_per_epoch must be a positive int .* got -3"),
    ("sampling_frequency", 1.5, TypeError, "sampling_frequency .* got float 1.5"),
    ("num_epochs", True, TypeError, "num_epochs .* got the bool True"),
    ("steps_per_epoch", "4", TypeError, "steps_per_epoch .* got str '4'"),
])
def test_bad_counts(name, bad, error, message):
    built = []
    with pytest.raises(error, match=message):
        bench.benchmark_dataloader(lambda: built.append(1) or [], **{name: bad})
    assert built == []  # refused before the dataloader is built
