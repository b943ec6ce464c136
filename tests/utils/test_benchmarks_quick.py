"""`python -m benchmarks`: the table it prints, from made-up results and from a quick run."""
import os
import re
import subprocess
import sys

import pytest
import torch

from benchmarks import __main__ as suite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _result(name, **peers):
    return {"workload": name, "title": "t", "steps": 3, "repeats": 2, "params": 10,
            "flops": 2e9, "peers": peers}


def test_the_table_gives_ratios_to_cstorch_the_floor_share_and_failed_peers():
    results = [_result("gpt-small",
                       eager={"ms": [30.0, 20.0, 40.0], "first_step_s": 0.1, "loss": 1.0},
                       **{"torch-compile": {"error": "RuntimeError: no compiler"}},
                       cstorch={"ms": [10.0, 12.0, 11.0], "first_step_s": 9.0, "loss": 1.0})]
    table = suite.training_table(results, rate=100.0)   # 2 GFLOP at 100 GFLOP/s: 20 ms
    rows = {line.split(" | ")[1]: line for line in table.splitlines()[2:]}
    assert "| 20.00 |" in rows["physical floor: 2 GFLOP/step at 100 GFLOP/s"]
    # The ratio pairs the passes (30/10, 20/12, 40/11): not the ratio of medians (2.73x).
    assert "| 30.00 | 20.00-40.00 | 3.00x (1.67-3.64) | 66.7% |" in rows["eager PyTorch"]
    assert ("| 11.00 | 10.00-12.00 | 1.00x (1.00-1.00) | 181.8% |"
            in rows["cstorch traced step (CPU backend)"])
    assert "failed: RuntimeError: no compiler" in rows["torch.compile (inductor, CPU)"]
    assert "not run: project rule" in rows["torchax"]


def _executor(model, bare, executor, prefetch):
    return {"workload": "executor", "model": model, "title": "T", "steps": 3,
            "repeats": len(bare), "loops": {"bare": {"ms": bare}, "executor": {"ms": executor},
                                            "executor-prefetch": {"ms": prefetch}}}


def test_the_executor_table_gives_the_overhead_over_the_bare_loop_per_step():
    r = {"workload": "executor", "models": [
        _executor("mlp-tiny", [1.0, 2.0, 1.0], [1.1, 2.1, 1.3], [1.5, 3.0, 1.5]),
        {"model": "gpt-small", "error": "exit status 1: boom"}]}
    rows = suite.executor_table(r).splitlines()[2:]
    # Paired per pass: ratios 1.10, 1.05, 1.30 and differences 100, 100, 300 µs.
    assert rows[1].endswith("| 3 x 3 | 1.30 | 1.10-2.10 | +10.0% (+5.0 to +30.0%) | +100.0 |")
    assert "| +50.0% (+50.0 to +50.0%) | +500.0 |" in rows[2]
    assert "gpt-small | failed: exit status 1: boom" in rows[3]


@pytest.mark.slow
def test_a_quick_run_prints_ratio_rows():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--workloads",
                           "mlp-tiny", "--peers", "eager,jax,cstorch", "--steps", "5",
                           "--repeats", "2", "--no-write"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| mlp-tiny |")]
    peers = {line.split(" | ")[1]: line for line in rows}
    assert "physical floor" in rows[0]
    for peer in ("eager PyTorch", "hand-written jax.jit", "cstorch traced step (CPU backend)"):
        assert re.fullmatch(r"\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)",
                            peers[peer].split(" | ")[4])   # cstorch speed vs the peer
    assert "not run: project rule" in peers["torchax"]


def test_steal_time_is_the_share_of_cpu_time_given_to_other_tenants(monkeypatch):
    from collections import namedtuple

    from benchmarks import _report
    times = namedtuple("scputimes", "user system idle steal")
    before = times(100.0, 10.0, 50.0, 5.0)
    monkeypatch.setattr(_report.psutil, "cpu_times", lambda: times(130.0, 20.0, 90.0, 25.0))
    assert _report.steal_since(before) == "steal time 20.0%"   # 20 of 100 s
    no_steal = namedtuple("scputimes", "user system idle")
    monkeypatch.setattr(_report.psutil, "cpu_times", lambda: no_steal(1.0, 1.0, 1.0))
    assert _report.steal_since(no_steal(0.0, 0.0, 0.0)) == "steal time not counted by this OS"


def test_the_report_says_the_steal_time_of_each_workload():
    results = [dict(_result("gpt-small", cstorch={"ms": [10.0], "first_step_s": 1.0,
                                                  "loss": 1.0}), steal="steal time 12.5%"),
               {"workload": "executor", "steal": "steal time 0.4%",
                "models": [_executor("mlp-tiny", [1.0], [1.1], [1.5])]}]
    text = suite.report("python -m benchmarks", "here", results, (100.0, 90.0, 110.0), False)
    assert "2 timed passes; steal time 12.5%" in text
    assert "in a shuffled order; steal time 0.4%." in text


def test_the_peers_take_turns_in_an_order_shuffled_pass_by_pass(monkeypatch):
    from benchmarks import harness
    from benchmarks import peers as makers
    calls = []

    def fake(name):
        def make(workload, model):
            def run(*args):
                calls.append(name)
                return torch.zeros(())
            return run
        return make
    monkeypatch.setattr(makers, "MAKERS", {p: fake(p) for p in makers.ORDER})
    result = harness.measure("mlp-tiny", steps=1, repeats=6)
    assert all(len(p["ms"]) == 6 for p in result["peers"].values())
    n = len(makers.ORDER)
    timed = calls[2 * n:]   # after each peer's first step and warm-up pass
    passes = [tuple(timed[i:i + n]) for i in range(0, len(timed), n)]
    assert all(sorted(p) == sorted(makers.ORDER) for p in passes)
    assert len(set(passes)) > 1


def test_the_executor_loops_take_turns_in_an_order_shuffled_pass_by_pass(monkeypatch):
    from benchmarks import harness
    from benchmarks import peers as makers
    from cstorch.utils.data.executor import running_executor
    loops = []

    def make(workload, model):
        def step(*batch):
            ex = running_executor()
            loops.append("bare" if ex is None else "prefetch" if ex.prefetch else "executor")
            return torch.zeros(())
        step.optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        step.captures = 1
        return step
    monkeypatch.setattr(makers, "cstorch_step", make)
    result = harness.measure_executor(steps=1, repeats=6)
    assert all(len(v["ms"]) == 6 for v in result["loops"].values())
    timed = loops[3:]   # after each loop's warm-up pass
    passes = [tuple(timed[i:i + 3]) for i in range(0, len(timed), 3)]
    assert all(sorted(p) == ["bare", "executor", "prefetch"] for p in passes)
    assert len(set(passes)) > 1
