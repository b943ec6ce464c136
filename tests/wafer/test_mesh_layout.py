"""cstorch.mesh on the emulated cluster: a CSX backend of 4 systems over 8 devices lays
tensors out as distribute_tensor / all_slice / all_gather say (sharding constraints in the
lowered program, collectives in the compiled one) and trains as the same step without
them, and as eager PyTorch. On the CPU backend the functions are the identity and leave
no trace in the program."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = r"""
import copy, glob, json, os, sys
import torch
import cerebras.pytorch as cstorch
from cerebras.pytorch import mesh as M
from cerebras.pytorch.distributed import ClusterConfig

kind, art = sys.argv[1], sys.argv[2]
extra = {"cluster_config": ClusterConfig(num_csx=4)} if kind == "CSX" else {}
backend = cstorch.backend(kind, artifact_dir=art, **extra)
cstorch.backends.csx.precision.optimization_level = 0   # float32 products, as eager

torch.manual_seed(0)
eager = torch.nn.Linear(16, 8)
models = [copy.deepcopy(eager), copy.deepcopy(eager)]
compiled = [cstorch.compile(m, backend) for m in models]
opts = [cstorch.optim.SGD(m.parameters(), lr=0.1) for m in models]
eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
# A 2x2 mesh of boxes whose first axis runs along systems 0, 1 (the cluster's second
# axis when its 4 systems are taken as 2x2 in csx_id order).
boxes = M.Mesh("boxes", [[M.Box(0, 0, 0, 0), M.Box(1, 2, 0, 0)], [M.Box(2, 1, 0, 0), M.Box(3, 3, 0, 0)]])
spec = M.sharding_spec([M.Shard(0), M.Replicate()], boxes)

def train(i, x, y, annotate):
    if annotate:
        x = M.distribute_tensor(x, spec, ["batch", "features"])
    h = compiled[i](x)
    if annotate:
        h = M.all_slice(h, [M.Shard(1)], None)
        h = M.all_gather(h, [0])
        h = cstorch.nn.functional.CSXMeshShard.apply(h, "boxes", (None, None), None, (), None, None)
    loss = ((h - y) ** 2).mean()
    loss.backward()
    opts[i].step()
    opts[i].zero_grad()
    return loss, h

@cstorch.trace
def annotated(x, y):
    return train(0, x, y, True)

@cstorch.trace
def plain(x, y):
    return train(1, x, y, False)

g = torch.Generator().manual_seed(1)
out = {"annotated": [], "plain": [], "eager": []}
for _ in range(3):
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
    for name, fn in (("annotated", annotated), ("plain", plain)):
        loss, h = fn(x, y)
        out[name].append([float(loss)] + h.host().flatten().tolist())
    h = eager(x)
    loss = ((h - y) ** 2).mean()
    loss.backward()
    eager_opt.step()
    eager_opt.zero_grad()
    out["eager"].append([float(loss)] + h.detach().flatten().tolist())
out["weights"] = [m.weight.detach().flatten().tolist() for m in models + [eager]]
t = torch.randn(4, 4)
out["eager_identity"] = all(f(t, *a) is t for f, a in (
    (M.distribute_tensor, (spec, None)), (M.all_gather, ([0],)), (M.all_slice, ([M.Shard(0)], None)),
    (M.d2d_transfer, (0,)), (M.m2m_transfer, (boxes, boxes))))
for name in ("annotated", "plain"):
    for ext in ("aten.txt", "stablehlo.mlir", "hlo.txt"):
        out[f"{name}.{ext}"] = open(os.path.join(art, f"{name}.{ext}")).read()
if kind == "CSX":
    for name, ids in (("part", [0, 1]), ("reversed", [1, 0, 2, 3])):
        m = M.Mesh(name, [M.Box(i, c, 0, 0) for i, c in enumerate(ids)])
        @cstorch.trace
        def refused(x):
            return M.distribute_tensor(x, M.sharding_spec([M.Shard(0)], m), None)
        try:
            refused(torch.ones(4, 4))
            out[name] = None
        except ValueError as e:
            out[name] = str(e)
    errors = {}
    for name, fn in (
            ("dim", lambda x: M.distribute_tensor(x, M.sharding_spec([M.Shard(2), M.Replicate()], boxes), None)),
            ("partial", lambda x: M.distribute_tensor(x, M.ShardingSpec("boxes", (0, None), (1,), "sum", None), None)),
            ("devices", lambda x: M.distribute_tensor(x, M.ShardingSpec("boxes", (0, None), (), None, [0]), None)),
            ("axes", lambda x: M.distribute_tensor(x, M.ShardingSpec("boxes", (0,), (), None, None), None)),
            ("spec", lambda x: M.distribute_tensor(x, [M.Shard(0)], None)),
            ("tensor", lambda x: M.all_slice(x.tolist, [M.Shard(0)], None)),
            ("gather", lambda x: M.all_gather(x, [1])),
            ("slice", lambda x: M.all_slice(x, [M.Shard(0), M.Shard(1)], None))):
        step = cstorch.trace(fn)
        try:
            step(torch.ones(4, 4))
            errors[name] = None
        except Exception as e:
            errors[name] = type(e).__name__
    out["errors"] = errors
print(json.dumps(out))
"""


def _run(kind, tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, kind, str(tmp_path / kind)], env=env,
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _close(a, b):
    return all(abs(p - q) <= 1e-4 * max(abs(q), 1e-3) for p, q in zip(a, b)) and len(a) == len(b)


@pytest.fixture(scope="module")
def csx(tmp_path_factory):
    return _run("CSX", tmp_path_factory.mktemp("mesh"))


@pytest.fixture(scope="module")
def cpu(tmp_path_factory):
    return _run("CPU", tmp_path_factory.mktemp("mesh"))


def test_layouts_are_sharding_constraints_of_the_lowered_step(csx):
    annotated = csx["annotated.stablehlo.mlir"]
    # The boxes' mesh over the devices in their one order: box axis 0 is the second.
    assert '["box1"=2, "box0"=2, "rows"=1, "cols"=2]' in annotated
    constraints = [line for line in annotated.splitlines() if "sdy.sharding_constraint" in line]
    specs = [line.split("<", 1)[1].split(">", 1)[0].split(", ", 1)[1] for line in constraints]
    # distribute_tensor (batch over the boxes), all_slice (features), all_gather (whole),
    # CSXMeshShard (whole), and the gradients' constraints of the backward pass.
    assert specs[:4] == ['[{"box0"}, {}]', '[{}, {"box0"}]', '[{}, {}]', '[{}, {}]']
    assert "sdy.sharding_constraint" not in csx["plain.stablehlo.mlir"]
    assert "bridge.mesh_layout.default" in csx["annotated.aten.txt"]
    # XLA's partitioner turned the layouts into collectives across the systems.
    assert csx["annotated.hlo.txt"].count("all-gather(") > csx["plain.hlo.txt"].count("all-gather(")


def test_annotated_step_trains_as_the_plain_step_and_eager(csx):
    for a, p, e in zip(csx["annotated"], csx["plain"], csx["eager"]):
        assert _close(a, p) and _close(a, e)
    w_annotated, w_plain, w_eager = csx["weights"]
    assert _close(w_annotated, w_plain) and _close(w_annotated, w_eager)


def test_a_mesh_missing_systems_or_out_of_order_is_refused(csx):
    assert "must hold each of its 4 systems once" in csx["part"]
    assert "not in csx_id order" in csx["reversed"]


def test_layout_errors_inside_a_step(csx):
    assert csx["errors"] == {"dim": "IndexError", "partial": "NotImplementedError",
                             "devices": "NotImplementedError", "axes": "ValueError",
                             "spec": "TypeError", "tensor": "TypeError", "gather": "IndexError",
                             "slice": "ValueError"}


def test_outside_a_step_the_functions_return_their_tensor(csx, cpu):
    assert csx["eager_identity"] and cpu["eager_identity"]


def test_cpu_backend_layouts_are_the_identity(cpu):
    for a, p, e in zip(cpu["annotated"], cpu["plain"], cpu["eager"]):
        assert _close(a, p) and _close(a, e)
    assert "mesh_layout" not in cpu["annotated.aten.txt"]
    assert "sharding_constraint" not in cpu["annotated.stablehlo.mlir"]
    assert "all-gather" not in cpu["annotated.hlo.txt"]
