"""Files written by `cstorch.save`, read field by field with plain h5py."""
import json
import os
import pickle

import h5py
import hdf5plugin  # noqa: F401  (LZ4 filter)
import numpy as np
import pytest
import torch
import torch.utils._pytree as pytree

import cstorch


def _meta(f, key):
    outer = json.loads(f.attrs[f"{key}.__metadata__"])
    assert outer["__objects__"] == [key]
    assert outer["__spec__"][0] == {key: "*"}
    assert pytree.treespec_loads(outer["__spec__"][1]) == pytree.tree_flatten({key: 0})[1]
    return outer[f"{key}.__metadata__"]


@pytest.mark.parametrize("compress", [False, True])
def test_layout(tmp_path, compress):
    cstorch.backends.csx.performance.compress_weights = compress
    shared = torch.randn(5, 6)
    state = {"model": {"w": shared, "tied": shared, "bf": torch.randn(2, 3).to(torch.bfloat16)},
             "mask": torch.tensor([True, False]), "s": torch.tensor(2.5), "e": torch.zeros(0, 4),
             "i8": torch.arange(3, dtype=torch.int64), "step": 3, "lr": 0.5, "name": "x", "none": None,
             "obj": {1, 2}, "b": b"raw"}
    path = tmp_path / "c.mdl"
    cstorch.save(state, path)
    with h5py.File(path, "r") as f:
        assert f.attrs["__version__"] == 0.5
        assert f.attrs["__cstorch_version__"] == cstorch.__version__
        assert bool(f.attrs["__SUCCESS__"])
        stars, spec_json = json.loads(f.attrs["__spec__"])
        assert stars is None  # holds a set
        leaves, spec = pytree.tree_flatten(state)
        assert pytree.treespec_loads(spec_json) == spec
        w = f["model.w"]
        assert w.dtype == np.float32 and w.shape == (5, 6) and np.array_equal(w[()], shared.numpy())
        # LZ4 in chunks whatever the flag says (behaviour.json save_load); `compressed`
        # only records the flag.
        assert "32004" in w._filters and w.chunks == (5, 6)
        for name, value in [("__TORCH__", True), ("__NUMPY__", True), ("compressed", compress)]:
            assert bool(w.attrs[name]) == value
        assert w.attrs["__TYPE__"] == "TorchTensorSerializer"
        assert list(w.attrs["dtypes"]) == ["torch.float32"] or list(w.attrs["dtypes"]) == [b"torch.float32"]
        assert list(w.attrs["rtfx_dtypes"]) == [11] and w.attrs["shapes"].tolist() == [[5, 6]]
        inner = _meta(f, "model.w")
        assert inner == {"__TORCH__": True, "shapes": [[5, 6]], "dtypes": ["torch.float32"], "rtfx_dtypes": [11],
                         "__TYPE__": "TorchTensorSerializer", "__NUMPY__": True, "compressed": compress}
        assert "model.tied" not in f
        assert _meta(f, "model.tied") == {"key": "model.w", "__LINKED__": True,
                                          "__TYPE__": "LinkedObject", "__NONE__": True}
        bf = f["model.bf"]
        assert bf.dtype == np.int16 and _meta(f, "model.bf")["rtfx_dtypes"] == [15]
        assert np.array_equal(bf[()], state["model"]["bf"].view(torch.int16).numpy())
        assert f["mask"].dtype == np.bool_ and f["mask"][()].tolist() == [True, False]
        assert f["s"].shape == () and f["s"][()] == 2.5
        assert f["e"].shape == (0, 4)
        assert _meta(f, "step") == {"scalar_value": 3, "__TYPE__": "ScalarSerializer", "__NONE__": True}
        assert _meta(f, "lr")["scalar_value"] == 0.5
        assert _meta(f, "name") == {"string_value": "x", "__TYPE__": "StringSerializer", "__NONE__": True}
        assert _meta(f, "none") == {"__TYPE__": "NoneSerializer", "__NONE__": True}
        assert _meta(f, "obj.0")["__TYPE__"] == "ScalarSerializer"  # a set is a node, its items leaves
        obj = f["b"]
        assert obj.shape is None and obj.attrs["__TYPE__"] == "ObjectSerializer" and not obj.attrs["compressed"]
        assert pickle.loads(np.asarray(obj.attrs["__BYTES__"]).tobytes()) == b"raw"
        assert _meta(f, "b") == {"__TYPE__": "ObjectSerializer", "__BYTES__": True, "compressed": False}
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


def test_json_stars(tmp_path):
    cstorch.save({"a": {"b": torch.ones(1)}, "t": (1, 2)}, tmp_path / "c.mdl")
    with h5py.File(tmp_path / "c.mdl", "r") as f:
        assert json.loads(f.attrs["__spec__"])[0] == {"a": {"b": "*"}, "t": ["*", "*"]}


def test_temp_file_name_and_replace(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((src, dst))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    path = str(tmp_path / "c.mdl")
    cstorch.save({"a": 1}, path)
    (src, dst), = seen
    assert dst == path and src.startswith(path + ".") and src.endswith(".tmp")
    assert len(src) == len(path) + 1 + 8 + 4


def test_failed_save_leaves_nothing(tmp_path):
    path = tmp_path / "c.mdl"
    cstorch.save({"a": 1}, path)
    with pytest.raises(TypeError, match="'bad'.*pickled"):
        cstorch.save({"ok": torch.ones(2), "bad": lambda: 0}, path)
    assert os.listdir(tmp_path) == ["c.mdl"]
    assert cstorch.load(path) == {"a": 1}
