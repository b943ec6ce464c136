"""behaviour.json scenario `save_load`: the layout of files the real package writes (chunks,
LZ4 filter, attributes, links, deferred full tensors) and what loading gives back."""
import importlib
import json
import os

import h5py
import hdf5plugin  # noqa: F401  (LZ4 filter)
import numpy as np
import pytest
import torch

import cstorch
from tests.conftest import SHARED

SCENARIO = json.load(open(os.path.join(SHARED, "fixtures", "behaviour.json")))[
    "scenarios"]["save_load"]
CASES = SCENARIO["cases"]


@pytest.fixture
def fresh(monkeypatch):
    """A process with no backend yet, whichever the test then makes."""
    monkeypatch.setattr(importlib.import_module("cstorch.run.current"), "_backend", None)


def _attr(value):
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, np.ndarray):
        return [_attr(v) for v in value.tolist()]
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    return value


def _layout(path):
    """The file as the scenario records it: root attributes (JSON parsed) and datasets."""
    with h5py.File(path, "r") as f:
        root = {k: _attr(v) for k, v in f.attrs.items()}
        datasets = {}
        for key, ds in f.items():
            datasets[key] = {
                "shape": list(ds.shape), "dtype": str(ds.dtype),
                "chunks": list(ds.chunks) if ds.chunks else None,
                "filters": [int(k) for k in ds._filters],
                "storage_size_bytes": ds.id.get_storage_size(),
                "attrs": {k: _attr(v) for k, v in ds.attrs.items()}}
        order = list(f.attrs.keys())
    return root, datasets, order


def _check_file(path, want, check_storage=True):
    root, datasets, order = _layout(path)
    want_root = dict(want["root_attrs"])
    assert root.pop("__cstorch_version__") == cstorch.__version__
    want_root.pop("__cstorch_version__")
    assert root == want_root
    assert order == want["root_attr_order"]
    assert set(datasets) == set(want["datasets"])
    for key, ds in datasets.items():
        expected = dict(want["datasets"][key])
        size = expected.pop("storage_size_bytes")
        got_size = ds.pop("storage_size_bytes")
        if check_storage:
            assert got_size == size, key
        assert ds == expected, key


def _summary(t):
    return {"shape": list(t.shape), "dtype": str(t.dtype), "sum": float(t.double().sum())}


def test_zeros_and_full_on_cpu_are_chunked_lz4_datasets(tmp_path, fresh):
    # Issue 32: a 1000x1000 zeros tensor took 4 MB here (unchunked, unfiltered); the real
    # package writes 55 KB.
    case = CASES["lazy_zeros_full_cpu"]
    cstorch.backend("CPU")
    path = tmp_path / "c.mdl"
    cstorch.save({"z": cstorch.zeros((1000, 1000)), "f": cstorch.full((100,), 3.0)}, path)
    assert os.path.getsize(path) < 2 * case["file"]["file_size_bytes"]
    _check_file(path, case["file"])
    loaded = cstorch.load(path)
    for key, want in case["loaded"].items():
        assert isinstance(loaded[key], torch.Tensor)
        assert _summary(loaded[key]) == want["value"]


def test_dense_data_is_chunked_lz4_too(tmp_path):
    case = CASES["dense_sin_1000x1000"]
    w = torch.sin(torch.arange(1_000_000, dtype=torch.float64)).float().reshape(1000, 1000)
    path = tmp_path / "c.mdl"
    cstorch.save({"w": w}, path)
    # The storage size depends on the LZ4 build; layout and attributes do not.
    _check_file(path, case["file"], check_storage=False)
    got = _summary(cstorch.load(path)["w"])
    want = case["loaded"]["w"]["value"]
    assert got["shape"] == want["shape"] and got["dtype"] == want["dtype"]
    assert got["sum"] == pytest.approx(want["sum"], abs=1e-3)


def test_lazy_full_tensors_on_csx_are_metadata_only(tmp_path, fresh):
    case = CASES["deferred_full_tensor"]
    cstorch.backend("CSX")
    z, f = cstorch.zeros((1000, 1000)), cstorch.full((100,), 3.0)
    path = tmp_path / "c.mdl"
    cstorch.save({"z": z, "f": f}, path)
    assert not z.is_materialized and not f.is_materialized
    _check_file(path, case["file"])
    assert os.path.getsize(path) < 2 * case["file"]["file_size_bytes"]
    for map_location in (None, "cache", "cpu"):
        loaded = cstorch.load(path, map_location=map_location)
        for key, want in case["loaded"].items():
            assert isinstance(loaded[key], torch.Tensor)
            assert _summary(loaded[key]) == want["value"]
    assert torch.equal(loaded["f"], torch.full((100,), 3.0))


def test_a_built_full_tensor_on_csx_is_a_dataset(tmp_path, fresh):
    cstorch.backend("CSX")
    z = cstorch.zeros((3, 4))
    z.add_(torch.arange(12.0).reshape(3, 4))   # edited: its value is no longer the fill
    cstorch.save({"z": z}, tmp_path / "c.mdl")
    with h5py.File(tmp_path / "c.mdl", "r") as f:
        assert "z" in f and list(f["z"]._filters) == ["32004"]
    assert torch.equal(cstorch.load(tmp_path / "c.mdl")["z"], torch.arange(12.0).reshape(3, 4))


def _structure(value):
    if isinstance(value, dict):
        return {"type": type(value).__name__, "items": {k: _structure(v) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"type": type(value).__name__, "items": [_structure(v) for v in value]}
    if isinstance(value, torch.Tensor):
        return {"type": "tensor", "value": {"tensor": True, "dtype": str(value.dtype),
                                            "shape": list(value.shape),
                                            "values": value.reshape(-1).tolist()}}
    return {"type": type(value).__name__, "value": value}


def _tensors_named_alike(want):
    """The fixture's structure with the real package's tensor class named `tensor`."""
    if want.get("type") == "DeferredTorchTensor":
        return {**want, "type": "tensor"}
    if "items" in want:
        items = want["items"]
        items = ({k: _tensors_named_alike(v) for k, v in items.items()} if isinstance(items, dict)
                 else [_tensors_named_alike(v) for v in items])
        return {**want, "items": items}
    return want


@pytest.mark.parametrize("map_location", [None, "cache", "cpu"])
def test_plain_state_dict(tmp_path, map_location):
    case = CASES["plain_state_dict"]
    state = {"i": 3, "neg": -7, "big": 2**40, "f": 0.5, "b": True, "s": "hello", "n": None,
             "l": [1, 2.5, "x", None, [3, [4]]], "t": (1, "a"),
             "d": {"k": 1, "nested": {"z": [0.25]}}, "tensor": torch.tensor([1.5, -2.0]),
             "scalar_tensor": torch.tensor(7, dtype=torch.int64), "empty_list": [],
             "empty_dict": {}}
    path = tmp_path / "c.mdl"
    cstorch.save(state, path)
    # Same links (1 and 3 are the same objects wherever they appear, None is one object),
    # same metadata, tensor datasets chunked through LZ4 but the scalar one.
    _check_file(path, case["file"])
    loaded = cstorch.load(path, map_location=map_location)
    key = f"loaded_structure_map_location_{map_location}"
    assert _structure(loaded) == _tensors_named_alike(case[key])


def test_zeros_takes_the_shape_as_one_tuple():
    for make in (cstorch.zeros, cstorch.ones, lambda *a: cstorch.full(a[:1], 2.0, a[1])):
        with pytest.raises(TypeError, match=r"the shape is one tuple"):
            make(1000, 1000)
    assert cstorch.zeros((1000, 1000)).shape == (1000, 1000)


def test_the_documents_parameter_names_still_work(tmp_path):
    w = torch.randn(3, 2)
    cstorch.save(obj={"w": w}, checkpoint_file=tmp_path / "a.mdl")
    cstorch.save(state_dict={"w": w}, ckpt_path=tmp_path / "b.mdl")
    for name in ("a.mdl", "b.mdl"):
        assert torch.equal(cstorch.load(checkpoint_file=tmp_path / name)["w"], w)
        assert torch.equal(cstorch.load(ckpt_path=tmp_path / name, map_location="cpu")["w"], w)
    with pytest.raises(TypeError, match="both 'ckpt_path' and its other name 'checkpoint_file'"):
        cstorch.load(ckpt_path=tmp_path / "a.mdl", checkpoint_file=tmp_path / "a.mdl")
    with pytest.raises(TypeError, match="multiple values for argument 'state_dict'"):
        cstorch.save({"w": w}, tmp_path / "c.mdl", obj={"w": w})


def test_to_deferred_keeps_values_structure_and_ties():
    w = torch.randn(4, 3)
    state = {"a": w, "b": w, "n": [torch.arange(5), 7, "x"]}
    out = cstorch.storage.to_deferred(state)
    assert out["a"] is out["b"] and out["n"][1:] == [7, "x"]
    assert torch.equal(out["a"], w) and torch.equal(out["n"][0], torch.arange(5))
    assert isinstance(out["a"], cstorch.storage.LazyTensor) and not out["a"].is_materialized
    assert cstorch.storage.to_deferred({"k": 1}) == {"k": 1}
