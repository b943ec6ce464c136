"""What `cstorch.save` writes, `cstorch.load` gives back."""
import collections
import datetime
import os

import numpy as np
import pytest
import torch

import cstorch
from cstorch.storage import DeferredFullTensor, LazyTensor

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
          torch.int16, torch.uint8, torch.bool, torch.int8, torch.complex64]


def _tensor(dtype, shape=(3, 4)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


@pytest.mark.parametrize("map_location", [None, "cache", "cpu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_dtypes(tmp_path, dtype, map_location):
    state = {"t": _tensor(dtype), "scalar": _tensor(dtype, ()), "empty": _tensor(dtype, (0, 4))}
    path = tmp_path / "c.mdl"
    cstorch.save(state, path)
    out = cstorch.load(path, map_location=map_location)
    for key, value in state.items():
        assert isinstance(out[key], torch.Tensor)
        assert out[key].dtype == dtype and out[key].shape == value.shape
        assert torch.equal(out[key], value)


def test_python_values_and_containers(tmp_path):
    Point = collections.namedtuple("Point", "x y")
    state = {
        "int": 7, "big_int": 2 ** 70, "float": 0.25, "bool": False, "str": "héllo", "none": None,
        "list": [1, [2, [3]]], "tuple": (1, "a", None), "od": collections.OrderedDict(b=1, a=2),
        "set": {4, 5, 6}, "empty_dict": {}, "empty_list": [], "int_keys": {0: "a", 1: "b"},
        "frozen": frozenset({1, 2}), "bytes": b"\x00\xff", "complex": 1 + 2j,
        "counter": collections.Counter("abca"), "deque": collections.deque([1, 2]),
        "date": datetime.datetime(2024, 1, 2, 3, 4, 5), "delta": datetime.timedelta(days=2),
        "np": np.arange(5, dtype=np.int32), "np_scalar": np.float32(1.5),
        "dtype": torch.bfloat16, "size": torch.Size([2, 3]),
        "dd": collections.defaultdict(list, {"k": [1]}), "point": Point(1, torch.ones(2)),
    }
    path = tmp_path / "c.mdl"
    cstorch.save(state, path)
    out = cstorch.load(path)
    for key, value in state.items():
        if key in ("np",):
            assert np.array_equal(out[key], value) and out[key].dtype == value.dtype
        elif key == "point":
            assert type(out[key]) is Point and out[key].x == 1 and torch.equal(out[key].y, value.y)
        else:
            assert out[key] == value, key
            if key != "size":  # torch's pytree flattens torch.Size as a tuple node
                assert type(out[key]) is type(value), key
    assert type(out["od"]) is collections.OrderedDict and list(out["od"]) == ["b", "a"]
    assert out["dd"].default_factory is list


def test_non_dict_roots(tmp_path):
    for obj in [[torch.ones(2), 3], (1, 2), torch.arange(3), 5, "s", None]:
        cstorch.save(obj, tmp_path / "c.mdl")
        out = cstorch.load(tmp_path / "c.mdl", map_location="cpu")
        if isinstance(obj, torch.Tensor):
            assert torch.equal(out, obj)
        elif isinstance(obj, list):
            assert torch.equal(out[0], obj[0]) and out[1] == 3
        else:
            assert out == obj and type(out) is type(obj)


@pytest.mark.parametrize("map_location", [None, "cache", "cpu"])
def test_tied_objects_stay_tied(tmp_path, map_location):
    shared = torch.randn(4)
    obj = [1, 2]
    state = {"a": shared, "b": {"c": shared}, "l1": obj, "l2": obj, "n1": None, "n2": None}
    cstorch.save(state, tmp_path / "c.mdl")
    out = cstorch.load(tmp_path / "c.mdl", map_location=map_location)
    assert out["a"] is out["b"]["c"] and torch.equal(out["a"], shared)
    assert out["n2"] is None
    # a list is a pytree node, so its leaves tie, not the list itself
    assert out["l1"] == out["l2"] == [1, 2]


def test_lazy_tensor_behaves_as_tensor(tmp_path):
    w = torch.randn(3, 4)
    cstorch.save({"w": w, "b": torch.zeros(3)}, tmp_path / "c.mdl")
    out = cstorch.load(tmp_path / "c.mdl")
    lw = out["w"]
    assert isinstance(lw, torch.Tensor) and isinstance(lw, LazyTensor)
    assert lw.shape == (3, 4) and lw.dtype == torch.float32 and lw.device.type == "cpu"
    assert not lw.is_materialized  # metadata did not read the data
    assert torch.equal(lw * 2 + 1, w * 2 + 1)
    assert torch.equal(torch.matmul(lw, torch.ones(4)), w @ torch.ones(4))
    assert lw.sum().item() == pytest.approx(w.sum().item())
    assert lw.tolist() == w.tolist() and np.array_equal(lw.numpy(), w.numpy())
    assert not lw.is_materialized  # None: read at each use, nothing kept
    assert "tensor(" in repr(lw)
    m = torch.nn.Linear(4, 3)
    m.load_state_dict({"weight": out["w"], "bias": out["b"]})
    assert torch.equal(m.weight.detach(), w)
    # in-place changes are kept rather than lost with a re-read
    lw.add_(1)
    assert torch.equal(lw, w + 1)


def test_cache_keeps_value(tmp_path):
    cstorch.save({"w": torch.arange(4.0)}, tmp_path / "c.mdl")
    out = cstorch.load(tmp_path / "c.mdl", map_location="cache")
    assert not out["w"].is_materialized
    out["w"] + 1
    assert out["w"].is_materialized


def test_lazy_survives_overwrite_and_delete(tmp_path):
    path = tmp_path / "c.mdl"
    cstorch.save({"w": torch.ones(3)}, path)
    out = cstorch.load(path)
    cstorch.save({"w": torch.zeros(3)}, path)
    assert torch.equal(out["w"], torch.ones(3))
    os.remove(path)
    assert torch.equal(out["w"], torch.ones(3))


def test_save_of_loaded_lazy_tensor_copies_it(tmp_path):
    cstorch.save({"w": torch.arange(6.0).reshape(2, 3)}, tmp_path / "a.mdl")
    a = cstorch.load(tmp_path / "a.mdl")
    cstorch.save(a, tmp_path / "a.mdl")  # same path: reads the old file while writing the new
    b = cstorch.load(tmp_path / "a.mdl", map_location="cpu")
    assert torch.equal(b["w"], torch.arange(6.0).reshape(2, 3))
    torch.save(a, tmp_path / "t.pt")
    assert torch.equal(torch.load(tmp_path / "t.pt")["w"], b["w"])


def test_map_location_variants(tmp_path):
    cstorch.save({"w": torch.ones(2), "n": 3}, tmp_path / "c.mdl")
    for loc in ["cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda s, l: s, lambda s, l: None]:
        out = cstorch.load(tmp_path / "c.mdl", map_location=loc)
        assert type(out["w"]) is torch.Tensor and torch.equal(out["w"], torch.ones(2)) and out["n"] == 3
    out = cstorch.load(tmp_path / "c.mdl", map_location=lambda s, l: torch.zeros(2))
    assert torch.equal(out["w"], torch.zeros(2))
    out = cstorch.load(tmp_path / "c.mdl", map_location="meta")
    assert out["w"].device.type == "meta"


def test_creation_ops():
    z = cstorch.zeros((2, 3))
    assert isinstance(z, torch.Tensor) and isinstance(z, DeferredFullTensor)
    assert z.shape == (2, 3) and z.dtype == torch.float32 and not z.is_materialized
    assert torch.equal(z + 1, torch.ones(2, 3))
    f = cstorch.full((2,), 7.5)
    assert f.dtype == torch.float32 and torch.equal(f, torch.full((2,), 7.5))
    assert cstorch.full((2,), 3).dtype == torch.int64 and cstorch.full(3, True).dtype == torch.bool
    o = cstorch.ones(4, dtype=torch.bfloat16)
    assert o.dtype == torch.bfloat16 and torch.equal(o, torch.ones(4, dtype=torch.bfloat16))
    base = torch.randn(3, 2).to(torch.float16)
    for fn, val in [(cstorch.zeros_like, 0), (cstorch.ones_like, 1)]:
        t = fn(base)
        assert t.shape == base.shape and t.dtype == torch.float16
        assert torch.equal(t, torch.full((3, 2), val, dtype=torch.float16))
    t = cstorch.full_like(base, 2.0, dtype=torch.int32)
    assert t.dtype == torch.int32 and torch.equal(t, torch.full((3, 2), 2, dtype=torch.int32))
    # in-place edits stick once built
    z.add_(2)
    assert torch.equal(z, torch.full((2, 3), 2.0))
    m = torch.nn.Linear(3, 2)
    m.load_state_dict({"weight": cstorch.ones((2, 3)), "bias": cstorch.zeros(2)})
    assert torch.equal(m.weight.detach(), torch.ones(2, 3))


def test_creation_op_errors():
    with pytest.raises(TypeError, match="dtype"):
        cstorch.zeros((2,), dtype="float32")
    with pytest.raises(ValueError, match="shape"):
        cstorch.ones((2, -1))
    with pytest.raises(TypeError, match="number"):
        cstorch.full((2,), "x")
    with pytest.raises(TypeError, match="torch.Tensor"):
        cstorch.zeros_like([1, 2])
    with pytest.raises(ValueError, match="scalar"):
        cstorch.full((2,), torch.ones(3))


@pytest.mark.parametrize("compress", [False, True])
def test_creation_ops_save_as_tensors(tmp_path, compress):
    cstorch.backends.csx.performance.compress_weights = compress
    state = {"z": cstorch.zeros((300, 40)), "f": cstorch.full((2, 2), 7.5), "b": cstorch.ones(5, dtype=torch.bfloat16),
             "m": cstorch.full((3,), True), "built": cstorch.zeros(3)}
    state["built"].add_(4)
    cstorch.save(state, tmp_path / "c.mdl")
    assert not state["z"].is_materialized  # written from the fill value, never built
    out = cstorch.load(tmp_path / "c.mdl", map_location="cpu")
    assert torch.equal(out["z"], torch.zeros(300, 40)) and torch.equal(out["f"], torch.full((2, 2), 7.5))
    assert torch.equal(out["b"], torch.ones(5, dtype=torch.bfloat16))
    assert torch.equal(out["m"], torch.ones(3, dtype=torch.bool))
    assert torch.equal(out["built"], torch.full((3,), 4.0))


def test_deferred_full_metadata_form(tmp_path):
    import h5py
    import json
    path = tmp_path / "c.mdl"
    cstorch.save({"x": 1, "y": 2}, path)
    with h5py.File(path, "a") as f:  # rewrite leaves into the DeferredFullTensor form
        for key, meta in [("x", {"shape": [2, 3], "dtype": "torch.float32", "fill_value": 1.5}),
                          ("y", {"shape": [4], "dtype": "torch.bfloat16", "fill_value": None})]:
            meta["__TYPE__"] = "DeferredFullTensor"
            outer = json.loads(f.attrs[f"{key}.__metadata__"])
            outer[f"{key}.__metadata__"] = meta
            outer["__objects__"] = []
            f.attrs[f"{key}.__metadata__"] = json.dumps(outer)
    out = cstorch.load(path)
    assert torch.equal(out["x"], torch.full((2, 3), 1.5))
    assert out["y"].dtype == torch.bfloat16 and out["y"].shape == (4,)


def test_compressed_round_trip(tmp_path):
    cstorch.backends.csx.performance.compress_weights = True
    state = {"w": torch.randn(100, 50), "b": torch.randn(8).to(torch.bfloat16), "s": torch.tensor(3),
             "e": torch.zeros(0, 2), "m": torch.tensor([True, False])}
    cstorch.save(state, tmp_path / "c.mdl")
    out = cstorch.load(tmp_path / "c.mdl", map_location="cpu")
    for k, v in state.items():
        assert torch.equal(out[k], v), k


def test_noncontiguous_grad_and_parameters(tmp_path):
    p = torch.nn.Parameter(torch.randn(3, 4))
    neg = torch.randn(3)._neg_view() if hasattr(torch.Tensor, "_neg_view") else torch.randn(3)
    state = {"p": p, "t": torch.randn(4, 3).t(), "neg": neg}
    cstorch.save(state, tmp_path / "c.mdl")
    out = cstorch.load(tmp_path / "c.mdl", map_location="cpu")
    assert torch.equal(out["p"], p.detach()) and torch.equal(out["t"], state["t"])
    assert torch.equal(out["neg"], state["neg"])


def test_jax_arrays_saved_as_tensors(tmp_path):
    jnp = pytest.importorskip("jax.numpy")
    state = {"a": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "b": jnp.ones(3, dtype=jnp.bfloat16)}
    cstorch.save(state, tmp_path / "c.mdl")
    out = cstorch.load(tmp_path / "c.mdl", map_location="cpu")
    assert torch.equal(out["a"], torch.arange(6.0).reshape(2, 3))
    assert out["b"].dtype == torch.bfloat16 and torch.equal(out["b"], torch.ones(3, dtype=torch.bfloat16))


def test_large_pickle_and_file_objects(tmp_path):
    big = bytes(range(256)) * 1000  # beyond the 64 KiB attribute limit
    cstorch.save({"big": big}, tmp_path / "c.mdl")
    assert cstorch.load(tmp_path / "c.mdl")["big"] == big
    with open(tmp_path / "c.mdl", "rb") as f:
        assert cstorch.load(f, map_location="cpu")["big"] == big
