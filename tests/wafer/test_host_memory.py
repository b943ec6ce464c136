"""wafer.keep_buffers_mapped: a CPU backend's steps reuse host memory instead of faulting
fresh pages in every step, unless the run's state is large (`fit_to_state`); the state's
host copies leave no freed space in the heap (`own_mappings`); the user's own glibc
settings win."""
import json
import os
import subprocess
import sys

import pytest

import wafer
from wafer import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A step whose intermediate (a 64 MB exponential, feeding a product and a sum) lives in the
# program's scratch buffer, allocated and freed by every call: the product reads it from
# memory, so XLA cannot fuse it away. (A cheap op: the test makes 32 calls.)
STEPS = r"""
import ctypes, gc, json, resource
import torch
import cerebras.pytorch as cstorch
import wafer

torch.manual_seed(0)
x, w = torch.randn(4096, 4096), torch.randn(4096, 16)
# Eager PyTorch first, as a script that builds its model before the backend: its OpenMP
# threads allocate before XLA's threads exist.
y = torch.exp(x)
expected = float((y @ w).sum() + y.sum())
backend = cstorch.backend("CPU")

@cstorch.trace
def step(x, w):
    y = torch.exp(x)
    return (y @ w).sum() + y.sum()


def median_faults(warm_up):
    # The heap grows to the most buffers alive at once (a call's buffers can outlive
    # the next call's start), a few calls' worth.
    for _ in range(warm_up):
        got = float(step(x, w))
        assert abs(got - expected) <= 1e-3 * abs(expected), (got, expected)
    faults = []
    for _ in range(9):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        float(step(x, w))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return sorted(faults)[4]


# A run whose state reaches the bound returns its buffers; once the state shrinks below
# it (the model dropped), the run keeps them again.
wafer.host_memory.LARGE_STATE_BYTES = 64
held = cstorch.compile(torch.nn.Linear(8, 8), backend)
own_large = wafer.host_memory._own_mappings
faults_large = median_faults(2)
del held
gc.collect()
print(json.dumps({"applied": wafer.keep_buffers_mapped(), "faults_large": faults_large,
                  "own_mappings": [own_large, wafer.host_memory._own_mappings],
                  "faults": median_faults(12)}))
ctypes.CDLL("libc.so.6").malloc_stats()   # to stderr: a section per arena
"""


def _run(*extra_envs):
    """STEPS in one process per environment, the processes side by side (page faults are
    counted per process)."""
    procs = []
    for extra_env in extra_envs:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
        env.update({"JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT, **extra_env})
        env.pop("XLA_FLAGS", None)
        procs.append(subprocess.Popen([sys.executable, "-c", STEPS], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        results.append({**json.loads(out.strip().splitlines()[-1]),
                        "arenas": err.count("Arena ")})
    return results


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's mallopt is Linux/glibc only")
def test_cpu_steps_reuse_their_buffers_unless_the_state_is_large_or_the_user_set_malloc():
    # The second: the user's own setting (glibc's default arena count, spelled out) is kept.
    tuned, untouched = _run({}, {"MALLOC_ARENA_MAX": "8"})
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
    # While the run's state is at least LARGE_STATE_BYTES, the 64 MB is mapped and unmapped
    # every call (in the one arena still); the user's settings stay as they are.
    assert tuned["own_mappings"] == [True, False], tuned
    assert tuned["faults_large"] > 0.8 * 2**26 / page, tuned
    assert untouched["own_mappings"] == [False, False], untouched


# An optimizer's state is made on the host and moved to the device: neither copy may be
# left in the heap, where the host copies' freed space would serve later buffers first.
PLACEMENT = r"""
import ctypes, json
import torch
import cerebras.pytorch as cstorch

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
backend = cstorch.backend("CPU")
model = cstorch.compile(torch.nn.Linear(2048, 2048), backend)
before = libc.mallinfo2()
optimizer = cstorch.optim.Adam(model.parameters())
after = libc.mallinfo2()
print(json.dumps({"heap_growth": after.arena - before.arena,
                  "mapped_growth": after.hblkhd - before.hblkhd}))
"""


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's mallopt is Linux/glibc only")
def test_an_optimizers_state_is_placed_in_mappings_of_its_own():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update({"JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT})
    proc = subprocess.run([sys.executable, "-c", PLACEMENT], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    state = 2 * (2048 * 2048 + 2048) * 4   # Adam's two moments
    # The device's moments stay mapped; the host's zeros were mapped and are gone.
    assert got["mapped_growth"] >= state, got
    # (The heap grows by about 5 MB of other allocations.)
    assert got["heap_growth"] < state / 2, got


def test_fit_to_state_maps_large_buffers_from_the_bound_on(monkeypatch):
    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(host_memory, "_glibc", Libc)
    monkeypatch.setattr(host_memory, "_applied", True)
    monkeypatch.setattr(host_memory, "_own_mappings", False)
    bound = host_memory.LARGE_STATE_BYTES
    mmap_max = host_memory._M_MMAP_MAX
    assert host_memory.fit_to_state(bound - 1) is False and calls == []
    assert host_memory.fit_to_state(bound) is True
    assert calls[-1] == (mmap_max, host_memory._MMAP_MAX)
    assert (host_memory._M_MMAP_THRESHOLD, host_memory.OWN_MAPPING_BYTES) in calls
    # Placing state maps large buffers whatever the run's size; leaving, the run's
    # own choice holds again, also one made while placing.
    assert host_memory.fit_to_state(bound - 1) is False and calls[-1] == (mmap_max, 0)
    with host_memory.own_mappings():
        assert calls[-1] == (mmap_max, host_memory._MMAP_MAX)
        host_memory.fit_to_state(bound)
        assert calls[-1] == (mmap_max, host_memory._MMAP_MAX)
    assert calls[-1] == (mmap_max, host_memory._MMAP_MAX)
    with host_memory.own_mappings():
        host_memory.fit_to_state(0)
    assert calls[-1] == (mmap_max, 0)
    # Where the user set glibc (or it is not glibc), nothing changes.
    monkeypatch.setattr(host_memory, "_applied", False)
    calls.clear()
    with host_memory.own_mappings():
        assert host_memory.fit_to_state(bound) is False
    assert calls == []


def test_not_applied_off_glibc(monkeypatch):
    monkeypatch.setattr(host_memory, "_applied", None)
    monkeypatch.setattr(host_memory.sys, "platform", "darwin")
    assert wafer.keep_buffers_mapped() is False


def test_only_malloc_settings_count_as_the_users():
    assert not host_memory.user_tuned_malloc({})
    assert not host_memory.user_tuned_malloc({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"})
    assert host_memory.user_tuned_malloc({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert host_memory.user_tuned_malloc({"MALLOC_TRIM_THRESHOLD_": "0"})
