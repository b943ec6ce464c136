"""`cstorch.utils.data.SyntheticDataset`: samples mirror the spec's structure, tensors are
cloned, callables get the sample index, finite datasets are map-style and infinite ones
iterate forever, and bad specs are refused with the path of the bad leaf."""
import pickle
from collections import OrderedDict
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.utils.data import dataset as dataset_module

SyntheticDataset = cstorch.utils.data.SyntheticDataset


class Pair(NamedTuple):
    left: object
    right: object


def _index_tensor(i):
    return torch.full((2,), float(i))


def test_importable_from_the_cerebras_alias():
    from cerebras.pytorch.utils.data import SyntheticDataset as aliased

    assert aliased is dataset_module.SyntheticDataset
    assert "SyntheticDataset" in cstorch.utils.data.__all__


def test_tensor_leaf_is_a_clone_with_the_same_values():
    spec = torch.randn(3, 4)
    ds = SyntheticDataset(spec, num_samples=2)
    first, second = ds[0], ds[1]
    torch.testing.assert_close(first, spec, rtol=0, atol=0)
    torch.testing.assert_close(second, spec, rtol=0, atol=0)
    assert first.data_ptr() != spec.data_ptr() and first.data_ptr() != second.data_ptr()
    # Writing into a sample leaves the spec and later samples untouched.
    expected = spec.clone()
    first.zero_()
    torch.testing.assert_close(spec, expected, rtol=0, atol=0)
    torch.testing.assert_close(ds[1], expected, rtol=0, atol=0)


def test_callable_leaf_receives_the_sample_index():
    seen = []

    def make(i):
        seen.append(i)
        return torch.arange(3) + 10 * i

    ds = SyntheticDataset({"ids": make}, num_samples=5)
    for i in (3, 0, 4):
        torch.testing.assert_close(ds[i]["ids"], torch.arange(3) + 10 * i)
    assert seen == [3, 0, 4]


def test_nested_structure_keeps_every_container_type():
    tensor = torch.randn(2)
    spec = {
        "a": [tensor, (_index_tensor, torch.zeros(1, dtype=torch.int32))],
        "b": OrderedDict([("z", Pair(left=tensor, right=[_index_tensor])), ("y", tensor)]),
        "c": Pair(left={"k": _index_tensor}, right=(tensor,)),
    }
    sample = SyntheticDataset(spec, num_samples=8)[7]

    assert type(sample) is dict and list(sample) == ["a", "b", "c"]
    assert type(sample["a"]) is list and type(sample["a"][1]) is tuple
    torch.testing.assert_close(sample["a"][0], tensor)
    torch.testing.assert_close(sample["a"][1][0], torch.full((2,), 7.0))
    assert sample["a"][1][1].dtype == torch.int32
    assert type(sample["b"]) is OrderedDict and list(sample["b"]) == ["z", "y"]
    assert type(sample["b"]["z"]) is Pair and type(sample["b"]["z"].right) is list
    torch.testing.assert_close(sample["b"]["z"].right[0], torch.full((2,), 7.0))
    assert type(sample["c"]) is Pair and type(sample["c"].left) is dict
    assert type(sample["c"].right) is tuple and len(sample["c"].right) == 1
    torch.testing.assert_close(sample["c"].left["k"], torch.full((2,), 7.0))


def test_finite_length_indexing_and_range():
    ds = SyntheticDataset({"i": _index_tensor}, num_samples=4)
    assert len(ds) == 4
    assert not isinstance(ds, torch.utils.data.IterableDataset)
    torch.testing.assert_close(ds[-1]["i"], torch.full((2,), 3.0))
    torch.testing.assert_close(ds[-4]["i"], torch.full((2,), 0.0))
    with pytest.raises(IndexError, match="index 4 is out of range for a dataset of 4"):
        ds[4]
    with pytest.raises(IndexError, match="index -5 is out of range"):
        ds[-5]
    with pytest.raises(TypeError, match="indices must be integers, not str"):
        ds["0"]


def test_zero_samples_is_an_empty_dataset():
    ds = SyntheticDataset(torch.ones(1), num_samples=0)
    assert len(ds) == 0
    assert list(torch.utils.data.DataLoader(ds, batch_size=2)) == []
    with pytest.raises(IndexError):
        ds[0]


def test_infinite_dataset_iterates_forever_and_has_no_length():
    ds = SyntheticDataset([_index_tensor])
    assert isinstance(ds, SyntheticDataset)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    assert ds.num_samples is None
    with pytest.raises(TypeError, match="infinite dataset"):
        len(ds)
    it = iter(ds)
    values = [next(it)[0][0].item() for _ in range(50)]
    assert values == [float(i) for i in range(50)]
    torch.testing.assert_close(ds[10**9][0], torch.full((2,), 1e9))
    with pytest.raises(IndexError, match="negative"):
        ds[-1]


def test_infinite_dataset_gives_each_worker_distinct_indices(monkeypatch):
    # Stands in for DataLoader worker 1 of 3, without starting processes.
    monkeypatch.setattr(dataset_module, "get_worker_info",
                        lambda: SimpleNamespace(id=1, num_workers=3))
    it = iter(SyntheticDataset(_index_tensor))
    assert [next(it)[0].item() for _ in range(4)] == [1.0, 4.0, 7.0, 10.0]


def test_infinite_dataset_survives_pickling_as_an_iterable():
    # DataLoader workers started with spawn receive the dataset pickled.
    spec = {"x": torch.randn(3)}
    ds = pickle.loads(pickle.dumps(SyntheticDataset(spec)))
    assert isinstance(ds, torch.utils.data.IterableDataset) and ds.num_samples is None
    torch.testing.assert_close(next(iter(ds))["x"], spec["x"])
    finite = pickle.loads(pickle.dumps(SyntheticDataset(spec, num_samples=3)))
    assert len(finite) == 3 and not isinstance(finite, torch.utils.data.IterableDataset)


def test_torch_dataloader_batches_finite_and_infinite_datasets():
    spec = {"i": lambda i: torch.tensor(i), "x": torch.randn(3)}
    finite = SyntheticDataset(spec, num_samples=10)
    batches = list(torch.utils.data.DataLoader(finite, batch_size=4, shuffle=True))
    assert [b["i"].shape[0] for b in batches] == [4, 4, 2]
    assert sorted(torch.cat([b["i"] for b in batches]).tolist()) == list(range(10))
    torch.testing.assert_close(batches[0]["x"], spec["x"].expand(4, 3))

    loader = torch.utils.data.DataLoader(SyntheticDataset(spec), batch_size=3)
    it = iter(loader)
    assert next(it)["i"].tolist() == [0, 1, 2]
    assert next(it)["i"].tolist() == [3, 4, 5]


def test_bad_leaf_names_its_path():
    with pytest.raises(TypeError, match=r'sample_spec\["x"\]\[1\] is a str'):
        SyntheticDataset({"x": [torch.ones(1), "oops"]}, num_samples=1)
    with pytest.raises(TypeError, match=r"sample_spec\[0\]\.right is a int.*torch\.Tensor"):
        SyntheticDataset([Pair(torch.ones(1), 3)])
    with pytest.raises(TypeError, match=r"sample_spec is a float"):
        SyntheticDataset(1.5)


def test_callable_returning_a_non_tensor_is_refused_when_sampled():
    ds = SyntheticDataset({"y": lambda i: i * 2}, num_samples=3)
    with pytest.raises(TypeError, match=r'callable at sample_spec\["y"\] returned a int '
                                        r"for sample index 2; it must return a torch\.Tensor"):
        ds[2]


@pytest.mark.parametrize("bad, error, message", [
    (-1, ValueError, "non-negative int or None.*got -1"),
    (2.5, TypeError, "non-negative int or None.*got float 2.5"),
    ("3", TypeError, "got str '3'"),
    (True, TypeError, "got the bool True"),
])
def test_bad_num_samples(bad, error, message):
    with pytest.raises(error, match=message):
        SyntheticDataset(torch.ones(1), num_samples=bad)


@pytest.mark.parametrize("spec", [{}, [], (), {"a": [], "b": {}}])
def test_empty_spec_is_refused(spec):
    with pytest.raises(ValueError, match="holds no tensors or callables"):
        SyntheticDataset(spec, num_samples=1)
