"""`python -m benchmarks`: the table it prints, from made-up results and from a quick run."""
import os
import subprocess
import sys

import pytest

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
    assert "| 30.00 | 20.00-40.00 | 2.73x | 66.7% |" in rows["eager PyTorch"]
    assert "| 11.00 | 10.00-12.00 | 1.00x | 181.8% |" in rows["cstorch traced step (CPU backend)"]
    assert "failed: RuntimeError: no compiler" in rows["torch.compile (inductor, CPU)"]
    assert "not run: project rule" in rows["torchax"]


def test_the_executor_table_gives_the_overhead_over_the_bare_loop():
    r = {"workload": "executor", "title": "MLP", "loops": {
        "bare": {"ms": [1.0, 1.0]}, "executor": {"ms": [1.1, 1.1]},
        "executor-prefetch": {"ms": [1.5, 1.5]}}}
    table = suite.executor_table(r)
    assert "+10.0%" in table and "+50.0%" in table


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
        assert peers[peer].split(" | ")[4].endswith("x")   # cstorch speed vs the peer
    assert "not run: project rule" in peers["torchax"]
