"""wafer.keep_buffers_mapped: a CPU backend's steps reuse host memory instead of faulting
fresh pages in every step; the user's own glibc settings win."""
import json
import os
import subprocess
import sys

import pytest

import wafer
from wafer import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A step whose intermediate (a 64 MB cumulative sum, feeding two reductions) lives in the
# program's scratch buffer, allocated and freed by every call.
STEPS = r"""
import ctypes, json, resource
import torch
import cerebras.pytorch as cstorch
import wafer

torch.manual_seed(0)
x, w = torch.randn(4096, 4096), torch.randn(4096, 16)
# Eager PyTorch first, as a script that builds its model before the backend: its OpenMP
# threads allocate before XLA's threads exist.
y = torch.cumsum(x, 0)
expected = float((y @ w).sum() + y.tanh().sum())
backend = cstorch.backend("CPU")

@cstorch.trace
def step(x, w):
    y = torch.cumsum(x, 0)
    return (y @ w).sum() + y.tanh().sum()

# The heap grows to the most buffers alive at once (a call's buffers can outlive the
# next call's start), a few calls' worth.
for _ in range(12):
    got = float(step(x, w))
    assert abs(got - expected) <= 1e-3 * abs(expected), (got, expected)
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    float(step(x, w))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": wafer.keep_buffers_mapped(), "faults": sorted(faults)[8], "all": faults}))
ctypes.CDLL("libc.so.6").malloc_stats()   # to stderr: a section per arena
"""


def _run(extra_env):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update({"JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT, **extra_env})
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", STEPS], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]),
            "arenas": proc.stderr.count("Arena ")}


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's mallopt is Linux/glibc only")
def test_cpu_steps_reuse_their_buffers_unless_the_user_set_malloc():
    tuned = _run({})
    # The user's own setting (glibc's default arena count, spelled out) is kept.
    untouched = _run({"MALLOC_ARENA_MAX": "8"})
    assert tuned["applied"] and not untouched["applied"]
    page = os.sysconf("SC_PAGE_SIZE")
    # 64 MB is 16,384 pages of 4 KiB: glibc maps and unmaps it every call unless the
    # buffer is kept.
    assert untouched["faults"] > 0.8 * 2**26 / page, untouched
    assert tuned["faults"] < 0.1 * 2**26 / page, tuned
    # Every thread shares the main arena, eager PyTorch's OpenMP threads too: importing
    # cstorch set the limit before they allocated. With glibc's default they take arenas
    # of their own, which XLA's threads are later handed in turn with the main one.
    assert tuned["arenas"] == 1, tuned
    assert untouched["arenas"] > 1, untouched


def test_not_applied_off_glibc(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.setattr(host_memory.sys, "platform", "darwin")
    assert wafer.keep_buffers_mapped() is False


def test_only_malloc_settings_count_as_the_users():
    assert not host_memory.user_tuned_malloc({})
    assert not host_memory.user_tuned_malloc({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
    assert host_memory.user_tuned_malloc({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert host_memory.user_tuned_malloc({"MALLOC_TRIM_THRESHOLD_": "0"})
