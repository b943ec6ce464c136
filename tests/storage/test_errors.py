"""Every way loading or saving can fail says what is wrong, as the API promises."""
import os
import pickle

import h5py
import numpy as np
import pytest
import torch

import cstorch
from cstorch.storage import UnsafePickleError


def test_missing_file(tmp_path):
    with pytest.raises(RuntimeError, match="does not exist"):
        cstorch.load(tmp_path / "nope.mdl")


def test_directory(tmp_path):
    with pytest.raises(RuntimeError, match="directory"):
        cstorch.load(tmp_path)


def test_text_file(tmp_path):
    p = tmp_path / "x.mdl"
    p.write_text("hello, not a checkpoint")
    with pytest.raises(RuntimeError, match="neither|not a cstorch HDF5 checkpoint"):
        cstorch.load(p)


def test_empty_file(tmp_path):
    p = tmp_path / "x.mdl"
    p.write_bytes(b"")
    with pytest.raises(RuntimeError, match=str(p)):
        cstorch.load(p)


@pytest.mark.parametrize("fraction", [0.05, 0.5, 0.9])
def test_truncated(tmp_path, fraction):
    p = tmp_path / "c.mdl"
    cstorch.save({"w": torch.randn(256, 256), "n": 1}, p)
    data = p.read_bytes()
    p.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(RuntimeError, match=str(p)):
        out = cstorch.load(p, map_location="cpu")
        out["w"].sum()


def test_corrupted_header(tmp_path):
    p = tmp_path / "c.mdl"
    cstorch.save({"w": torch.randn(16)}, p)
    data = bytearray(p.read_bytes())
    data[0:8] = b"garbage!"
    p.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=str(p)):
        cstorch.load(p)


def test_corrupted_metadata(tmp_path):
    p = tmp_path / "c.mdl"
    cstorch.save({"w": torch.randn(16), "n": 1}, p)
    with h5py.File(p, "a") as f:
        f.attrs["n.__metadata__"] = "{not json"
    with pytest.raises(RuntimeError, match="entry 'n'"):
        cstorch.load(p)
    with h5py.File(p, "a") as f:
        f.attrs["__spec__"] = "[[]"
    with pytest.raises(RuntimeError, match="corrupted"):
        cstorch.load(p)


def test_missing_dataset_and_unknown_serializer(tmp_path):
    p = tmp_path / "c.mdl"
    cstorch.save({"w": torch.randn(16), "n": 1}, p)
    with h5py.File(p, "a") as f:
        del f["w"]
        f.attrs["n.__metadata__"] = f.attrs["n.__metadata__"].replace("ScalarSerializer", "Mystery")
    with pytest.raises(RuntimeError, match="entry 'w'.*missing"):
        cstorch.load(p)


def test_unknown_serializer(tmp_path):
    p = tmp_path / "c.mdl"
    cstorch.save({"n": 1}, p)
    with h5py.File(p, "a") as f:
        f.attrs["n.__metadata__"] = f.attrs["n.__metadata__"].replace("ScalarSerializer", "Mystery")
    with pytest.raises(RuntimeError, match="unknown serializer type 'Mystery'"):
        cstorch.load(p)


def test_broken_link(tmp_path):
    p = tmp_path / "c.mdl"
    t = torch.ones(1)
    cstorch.save({"a": t, "b": t}, p)
    with h5py.File(p, "a") as f:
        f.attrs["b.__metadata__"] = f.attrs["b.__metadata__"].replace('"key": "a"', '"key": "zz"')
    with pytest.raises(RuntimeError, match="links to missing entry 'zz'"):
        cstorch.load(p)


def test_plain_hdf5_and_incomplete(tmp_path):
    p = tmp_path / "x.h5"
    with h5py.File(p, "w") as f:
        f["x"] = np.ones(3)
    with pytest.raises(RuntimeError, match="not a cstorch checkpoint"):
        cstorch.load(p)
    q = tmp_path / "c.mdl"
    cstorch.save({"a": 1}, q)
    with h5py.File(q, "a") as f:
        del f.attrs["__SUCCESS__"]
    with pytest.raises(RuntimeError, match="incomplete"):
        cstorch.load(q)


def test_lazy_read_failure_is_runtime_error(tmp_path):
    p = tmp_path / "c.mdl"
    cstorch.save({"w": torch.ones(3)}, p)
    out = cstorch.load(p)
    out["w"]._source.close()
    with pytest.raises(RuntimeError, match="cannot read tensor 'w'"):
        out["w"] + 1


def test_torch_save_fallback(tmp_path):
    p = tmp_path / "t.pt"
    torch.save({"w": torch.arange(3.0), "n": 2}, p)
    for loc in [None, "cache", "cpu"]:
        out = cstorch.load(p, map_location=loc)
        assert torch.equal(out["w"], torch.arange(3.0)) and out["n"] == 2
    out = cstorch.load(p, map_location="cpu", mmap=True)
    assert torch.equal(out["w"], torch.arange(3.0))


class Custom:
    def __init__(self):
        self.x = 1


def test_torch_save_unsafe_needs_opt_in(tmp_path):
    p = tmp_path / "t.pt"
    torch.save({"c": Custom()}, p)
    with pytest.raises(RuntimeError, match="allow_unsafe_pickle=True"):
        cstorch.load(p)
    assert cstorch.load(p, allow_unsafe_pickle=True)["c"].x == 1


def test_corrupted_torch_file(tmp_path):
    p = tmp_path / "t.pt"
    torch.save({"w": torch.arange(3.0)}, p)
    p.write_bytes(p.read_bytes()[:50])
    with pytest.raises(RuntimeError, match="torch.load cannot read it"):
        cstorch.load(p)


def test_unsafe_object_needs_opt_in(tmp_path):
    p = tmp_path / "c.mdl"
    cstorch.save({"c": Custom()}, p)
    with pytest.raises(UnsafePickleError, match=r"test_errors\.Custom.*allow_unsafe_pickle=True"):
        cstorch.load(p)
    with pytest.raises(RuntimeError):  # UnsafePickleError is a RuntimeError too
        cstorch.load(p)
    assert cstorch.load(p, allow_unsafe_pickle=True)["c"].x == 1


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch " + os.environ["CSTORCH_PWNED"],))


def test_malicious_pickle_does_not_run(tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    monkeypatch.setenv("CSTORCH_PWNED", str(marker))
    p = tmp_path / "c.mdl"
    cstorch.save({"ok": 1, "evil": _Evil()}, p)
    for loc in [None, "cache", "cpu"]:
        with pytest.raises(UnsafePickleError, match="system"):
            cstorch.load(p, map_location=loc)
    assert not marker.exists()
    # a payload planted directly in the dataset, not produced by save
    with h5py.File(p, "a") as f:
        f["ok"] = h5py.Empty("f")
        f["ok"].attrs["__BYTES__"] = np.frombuffer(pickle.dumps(_Evil()), dtype="V1")
        f.attrs["ok.__metadata__"] = f.attrs["evil.__metadata__"].replace("evil", "ok")
    with pytest.raises(UnsafePickleError):
        cstorch.load(p)
    assert not marker.exists()


def test_unsafe_defaultdict_factory(tmp_path):
    import collections
    p = tmp_path / "c.mdl"
    cstorch.save({"d": collections.defaultdict(os.getcwd, {"a": 1})}, p)
    with pytest.raises(UnsafePickleError, match="default_factory"):
        cstorch.load(p)
    assert cstorch.load(p, allow_unsafe_pickle=True)["d"]["a"] == 1


def test_bad_map_location(tmp_path):
    p = tmp_path / "c.mdl"
    cstorch.save({"a": 1}, p)
    with pytest.raises(ValueError, match="map_location"):
        cstorch.load(p, map_location="not-a-device")
    with pytest.raises(TypeError, match="map_location"):
        cstorch.load(p, map_location=3)
    cstorch.save({"w": torch.ones(1)}, p)
    with pytest.raises(TypeError, match="returned int"):
        cstorch.load(p, map_location=lambda s, l: 5)


def test_save_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cstorch.save({"a": 1}, tmp_path / "no" / "c.mdl")
    with pytest.raises(IsADirectoryError):
        cstorch.save({"a": 1}, tmp_path)
    with pytest.raises(ValueError, match="same key 'a.b'"):
        cstorch.save({"a.b": 1, "a": {"b": 2}}, tmp_path / "c.mdl")
    with pytest.raises(TypeError, match="cannot be pickled"):
        cstorch.save({"f": lambda: 1}, tmp_path / "c.mdl")
    assert os.listdir(tmp_path) == []
