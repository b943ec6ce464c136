"""Two processes launched by torchrun train data-parallel on JAX's distributed runtime
(GPU backend, dist_backend="gloo": CPU devices, two per process)."""
import copy
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from models import LR, MOMENTUM, global_batches, make_model  # noqa: E402


def eager_global_batch(kind):
    """One process, the whole global batch, torch's own SGD: what the run must equal."""
    torch.manual_seed(0)
    model = make_model(kind)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for x, y in global_batches(kind):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.tolist() for k, v in model.state_dict().items()}


def assert_close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               rtol=rtol, atol=atol)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("torchrun")
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS",)}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(HERE)),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", str(free_port()), os.path.join(HERE, "data_parallel_script.py"), str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return out, ranks


def test_data_parallel_equals_one_process_on_the_global_batch(run):
    _, ranks = run
    losses, state = eager_global_batch("mlp")
    for r in ranks:
        got = r["mlp-local"]
        assert got["world"] == 2 and got["devices"] == 4
        assert_close(got["losses"], losses)
        for k in state:
            assert_close(got["state"][k], state[k])


def test_sync_batchnorm_equals_one_process_batch_norm(run):
    _, ranks = run
    losses, state = eager_global_batch("bn")
    for r in ranks:
        got = r["bn-sync"]
        assert_close(got["losses"], losses)
        for k in state:   # running statistics included
            assert_close(got["state"][k], state[k])


def test_default_batch_norm_is_per_process_as_under_ddp(run):
    _, ranks = run
    for r in ranks:
        got = r["bn-local"]
        # The peer is torch's DistributedDataParallel in the same processes.
        assert_close(got["losses"], got["ddp_losses"])
    main = ranks[0]["bn-local"]
    for k in main["state"]:   # running statistics follow process 0, as DDP's buffers do
        assert_close(main["state"][k], main["ddp_state"][k])
    # and per-process statistics are not the global batch's
    sync_losses, _ = eager_global_batch("bn")
    assert not np.allclose(main["losses"], sync_losses, rtol=1e-4)


def test_only_the_main_process_writes_and_every_process_loads(run):
    out, ranks = run
    assert (out / "rank0" / "checkpoint.mdl").is_file()
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "rank0" / "events").iterdir())
    assert (out / "rank0" / "artifacts" / "step.stablehlo.mlir").is_file()
    assert sorted(p.name for p in (out / "rank1").iterdir()) == []
    for r in ranks:
        for k, v in r["bn-sync"]["state"].items():
            assert_close(r["loaded"][k], v, rtol=0, atol=0)


def test_processes_agree(run):
    _, (a, b) = run
    for case in ("mlp-local", "bn-local", "bn-sync"):
        assert a[case]["losses"] == b[case]["losses"]
        assert a[case]["state"] == b[case]["state"]


def test_eager_reference_is_not_trivial():
    """The data-parallel checks compare trained values: training must move them."""
    torch.manual_seed(0)
    initial = {k: v.clone() for k, v in copy.deepcopy(make_model("mlp")).state_dict().items()}
    _, state = eager_global_batch("mlp")
    assert all(not np.allclose(state[k], initial[k].numpy()) for k in state)
