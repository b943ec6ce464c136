"""The checkpoint converter and inspect view: round trips through every format, errors."""
import collections
import os
import subprocess
import sys

import pytest
import torch

import cerebras.pytorch as cstorch
from cstorch.storage import cli
from tests.conftest import ROOT


def _obj():
    w = torch.randn(3, 4)
    return {"model": {"0.weight": w, "h": torch.randn(2).bfloat16(), "n": torch.tensor(5)},
            "step": 3, "name": "run", "none": None, "lst": [torch.ones(2), 1.5, (2, "a")],
            "od": collections.OrderedDict(a=torch.zeros(1, dtype=torch.int32)), "tied": w}


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def test_hdf5_orbax_torch_hdf5_round_trip(tmp_path):
    obj = _obj()
    cstorch.save(obj, str(tmp_path / "a.mdl"))
    steps = [("a.mdl", "b", "orbax"), ("b", "c.pt", "torch"), ("c.pt", "d.mdl", "hdf5")]
    for src, dst, to in steps:
        assert cli.main(["convert", str(tmp_path / src), str(tmp_path / dst), "--to", to]) == 0
        assert cli.detect_format(tmp_path / dst) == to
        back = cstorch.load(str(tmp_path / dst), map_location="cpu")
        assert _equal(obj, back), dst
        assert back["tied"] is back["model"]["0.weight"]


def test_inspect_prints_keys_shapes_dtypes_and_sizes(tmp_path, capsys):
    cstorch.save(_obj(), str(tmp_path / "a.mdl"))
    assert cli.main(["inspect", str(tmp_path / "a.mdl")]) == 0
    out = capsys.readouterr().out
    assert "(hdf5)" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert lines["model.0.weight"][1:5] == ["tensor", "3x4", "float32", "48"]
    assert lines["model.h"][1:4] == ["tensor", "2", "bfloat16"]
    assert lines["model.n"][1:4] == ["tensor", "()", "int64"]
    assert lines["step"][1:3] == ["int", "3"]
    assert "12 entries, 6 tensors, total 120 B" in out


def test_the_module_runs_as_a_command(tmp_path):
    torch.save({"w": torch.ones(2, 2)}, tmp_path / "w.pt")
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "cstorch.storage.cli", "inspect", str(tmp_path / "w.pt")],
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(torch)" in proc.stdout and "2x2" in proc.stdout and "float32" in proc.stdout


def test_objects_orbax_cannot_hold_are_dropped_with_a_warning(tmp_path):
    cstorch.save({"w": torch.ones(2), "blob": b"raw", "inf": float("inf")}, str(tmp_path / "a.mdl"))
    with pytest.warns(UserWarning, match="blob"):
        dropped = cli.convert(tmp_path / "a.mdl", tmp_path / "o", "orbax")
    assert dropped == ["blob", "inf"]
    back = cstorch.load(str(tmp_path / "o"))
    assert back["blob"] is None and back["inf"] is None and torch.equal(back["w"], torch.ones(2))


def test_errors(tmp_path, capsys):
    assert cli.main(["inspect", str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "dir").mkdir()
    assert cli.main(["inspect", str(tmp_path / "dir")]) == 1
    assert "not an Orbax checkpoint" in capsys.readouterr().err
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint")
    assert cli.main(["inspect", str(tmp_path / "junk.bin")]) == 1
    assert "torch.load cannot read it" in capsys.readouterr().err

    cstorch.save({"w": torch.ones(2)}, str(tmp_path / "a.mdl"))
    torch.save({"w": torch.zeros(2)}, tmp_path / "b.pt")
    assert cli.main(["convert", str(tmp_path / "a.mdl"), str(tmp_path / "b.pt"), "--to", "torch"]) == 1
    assert "--force" in capsys.readouterr().err
    assert torch.equal(torch.load(tmp_path / "b.pt")["w"], torch.zeros(2))  # kept
    assert cli.main(["convert", str(tmp_path / "a.mdl"), str(tmp_path / "b.pt"), "--to", "torch",
                     "--force"]) == 0
    assert torch.equal(torch.load(tmp_path / "b.pt")["w"], torch.ones(2))
    assert cli.main(["convert", str(tmp_path / "a.mdl"), str(tmp_path / "a.mdl"), "--to", "hdf5"]) == 1
    assert "same path" in capsys.readouterr().err
    assert cli.main(["convert", str(tmp_path / "missing"), str(tmp_path / "x"), "--to", "hdf5"]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert cli.main(["convert", str(tmp_path / "a.mdl"), str(tmp_path / "no" / "x.pt"), "--to",
                     "torch"]) == 1
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["convert", str(tmp_path / "a.mdl"), str(tmp_path / "x"), "--to", "zip"])
    with pytest.raises(ValueError, match="unknown format"):
        cli.convert(tmp_path / "a.mdl", tmp_path / "x", "zip")
