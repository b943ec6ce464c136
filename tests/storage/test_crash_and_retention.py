"""An interrupted save keeps the previous checkpoint; max_checkpoints prunes old ones."""
import os
import signal
import subprocess
import sys
import textwrap
import types

import pytest
import torch

import cstorch
from cstorch.storage import retention

_WRITER = textwrap.dedent("""
    import sys, torch, cstorch
    import cstorch.storage.serializers as s
    real = s.write_tensor
    def slow(*a, **k):
        out = real(*a, **k)
        print("wrote", flush=True)
        import time; time.sleep(0.05)
        return out
    s.write_tensor = slow
    import cstorch.storage.writer as w
    w.write_tensor = slow
    cstorch.save({f"w{i}": torch.full((256, 1024), float(i)) for i in range(200)}, sys.argv[1])
""")


def test_sigkill_mid_save_keeps_previous(tmp_path):
    path = tmp_path / "c.mdl"
    cstorch.save({"version": 1, "w": torch.ones(4)}, path)
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(5):  # wait until it is well into writing tensors
            assert proc.stdout.readline().startswith("wrote")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    out = cstorch.load(path, map_location="cpu")
    assert out["version"] == 1 and torch.equal(out["w"], torch.ones(4))
    leftovers = [p for p in os.listdir(tmp_path) if p != "c.mdl"]
    assert all(p.startswith("c.mdl.") and p.endswith(".tmp") for p in leftovers)
    assert leftovers, "the killed save should have been writing a temp file"


def _backend(monkeypatch, n):
    """A stand-in for the current backend (the run core's slot), keeping `n` checkpoints."""
    monkeypatch.setattr(sys.modules["cstorch.run.current"], "_backend", types.SimpleNamespace(
        max_checkpoints=n, is_main_process=True))


def test_max_checkpoints(tmp_path, monkeypatch):
    _backend(monkeypatch, 2)
    paths = [tmp_path / f"c{i}.mdl" for i in range(4)]
    for i, p in enumerate(paths):
        cstorch.save({"i": i}, p)
    assert sorted(os.listdir(tmp_path)) == ["c2.mdl", "c3.mdl"]
    assert cstorch.load(paths[3])["i"] == 3
    # saving to a path again makes it the newest, not a second entry
    cstorch.save({"i": 2}, paths[2])
    cstorch.save({"i": 4}, tmp_path / "c4.mdl")
    assert sorted(os.listdir(tmp_path)) == ["c2.mdl", "c4.mdl"]


def test_max_checkpoints_keeps_old_when_save_fails(tmp_path, monkeypatch):
    _backend(monkeypatch, 1)
    cstorch.save({"i": 0}, tmp_path / "a.mdl")
    with pytest.raises(TypeError):
        cstorch.save({"f": lambda: 0}, tmp_path / "b.mdl")
    assert os.listdir(tmp_path) == ["a.mdl"]


def test_no_limit_keeps_all(tmp_path, monkeypatch):
    _backend(monkeypatch, None)
    for i in range(3):
        cstorch.save({"i": i}, tmp_path / f"c{i}.mdl")
    assert len(os.listdir(tmp_path)) == 3
    assert len(retention.written()) == 3


def test_max_checkpoints_of_a_real_backend(tmp_path):
    cstorch.backend("CPU", max_checkpoints=2)
    try:
        for i in range(4):
            cstorch.save({"i": i}, tmp_path / f"real{i}.mdl")
        assert sorted(os.listdir(tmp_path)) == ["real2.mdl", "real3.mdl"]
    finally:
        cstorch.backend("CPU")
