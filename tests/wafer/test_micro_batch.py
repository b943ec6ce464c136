"""`cstorch.backends.csx.performance.micro_batch_size`: a batch as micro-batches in one
on-device loop, the update once on the combined gradients; "auto" and "explore"."""
import copy
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cerebras.pytorch as cstorch
import wafer
from cstorch.tracing import micro_batch
from tests.conftest import ROOT

csx = cstorch.backends.csx


@pytest.fixture(autouse=True)
def _flags():
    # Float32 matmuls (precision level 0), so results compare with eager PyTorch.
    csx.precision.optimization_level = 0
    yield
    csx.precision.reset()
    csx.performance.reset()
    csx.debug.reset()


def _bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _setup(model, tmp_path, kind="CSX", lr=0.1):
    backend = cstorch.backend(kind, artifact_dir=str(tmp_path))
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=lr)

    @cstorch.trace
    def training_step(x, y):
        out = compiled(x)
        loss = F.cross_entropy(out, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss, out

    return backend, training_step


def _data(n=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def _program(step):
    return next(iter(step.programs.values()))[0]


# --- the loop itself (pure JAX) ---------------------------------------------------------

def test_run_micro_batches_combines_each_mode_in_one_loop():
    x = jnp.arange(12.0).reshape(6, 2)

    def body(i, carry, micro):
        (xs,) = micro
        (c,) = carry
        return [xs.sum(), c + 1, xs * 2, i, xs.mean()]

    modes = ["mean", "carry", "concat", "last", "mean"]
    shapes = [jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32),
              jax.ShapeDtypeStruct((2, 2), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32),
              jax.ShapeDtypeStruct((), jnp.float32)]
    fn = jax.jit(lambda x: wafer.run_micro_batches(body, [x], [jnp.int32(10)], modes, shapes, 3))
    mean_sum, carried, joined, last, mean = fn(x)
    assert float(mean_sum) == float(x.sum()) / 3
    assert int(carried) == 13 and int(last) == 2
    assert np.array_equal(np.asarray(joined), np.asarray(x * 2))
    assert np.isclose(float(mean), float(x.mean()))
    hlo = fn.lower(x).compile().as_text()
    assert len(re.findall(r"\bwhile\(", hlo)) == 1 and '"known_trip_count":{"n":"3"}' in hlo


# --- semantics on the CSX backend (one device, in this process) ------------------------

def test_batchnorm_model_matches_micro_batches_run_one_after_another(tmp_path):
    """The documented rule: forward and backward per micro-batch (BatchNorm normalises
    with each micro-batch's statistics and updates its running statistics once per
    micro-batch, in order), gradients averaged, the optimizer once."""
    net = _bn_net()
    reference = copy.deepcopy(net)
    csx.performance.micro_batch_size = 2
    _, step = _setup(net, tmp_path)
    x, y = _data()
    loss, out = step(x, y)
    assert _program(step).micro_batch_size == 2

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    losses, outs = [], []
    for i in range(4):
        o = reference(x[2 * i:2 * i + 2])
        part = F.cross_entropy(o, y[2 * i:2 * i + 2])
        (part / 4).backward()
        losses.append(float(part.detach()))
        outs.append(o.detach())
    ref_opt.step()
    assert abs(float(loss) - sum(losses) / 4) < 1e-6
    assert out.shape == (8, 3)   # per-sample outputs joined back into the batch
    assert torch.allclose(out, torch.cat(outs), atol=1e-6)
    for (name, a), b in zip(net.state_dict().items(), reference.state_dict().values()):
        assert torch.allclose(a.double(), b.double(), atol=1e-6), name
    assert int(net[1].num_batches_tracked) == 4   # counted per micro-batch forward


@pytest.mark.slow
def test_mean_loss_gives_the_whole_batch_result_over_steps(tmp_path):
    def run(size):
        torch.manual_seed(0)
        csx.performance.micro_batch_size = size
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
        _, step = _setup(model, tmp_path)
        losses = [float(step(*_data(8, i))[0]) for i in range(3)]
        return losses, [p.detach().clone() for p in model.parameters()], step

    whole, w_params, _ = run(None)
    split, s_params, step = run(4)
    assert _program(step).micro_batch_size == 4
    np.testing.assert_allclose(split, whole, rtol=1e-6)
    for a, b in zip(s_params, w_params):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_batch_the_size_does_not_divide_is_refused_naming_both(tmp_path):
    csx.performance.micro_batch_size = 3
    _, step = _setup(_bn_net(), tmp_path)
    with pytest.raises(ValueError, match=r"micro_batch_size is 3, which does not divide the "
                                         r"batch size 8.*1, 2, 4, 8"):
        step(*_data(8))


def test_auto_picks_the_largest_size_that_fits_and_says_which(tmp_path, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 3))
    _, step = _setup(model, tmp_path)
    # XLA's scratch memory grows with the micro-batch (on this CPU about 640 KiB for the
    # whole batch of 256, 200 KiB at 64, 136 KiB at 32): a 0.15 MiB budget takes 32.
    csx.debug.act_memory_gi = 0.15 / 1024
    step(*_data(256))
    chosen = _program(step)
    err = capsys.readouterr().err
    size = chosen.micro_batch_size
    assert size and 256 % size == 0
    assert f"micro_batch_size 'auto' chose {size} for training_step" in err
    measured = dict(re.findall(r"(\d+): ([\d.]+ [KMG]iB)", err.split("measured per size:")[1]))
    limit = 0.15 * 2 ** 20
    assert wafer.micro_batch.temp_bytes(chosen.compiled.executable) <= limit
    assert str(2 * size) in measured   # the next size up was measured, and did not fit
    value, unit = measured[str(2 * size)].split()
    assert float(value) * {"KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}[unit] > limit


def test_auto_runs_a_batch_that_fits_whole(tmp_path):
    _, step = _setup(_bn_net(), tmp_path)
    assert csx.performance.micro_batch_size == "auto"
    step(*_data(8))
    assert _program(step).micro_batch_size is None and step.captures == 1


def test_explore_prints_a_table_and_trains_nothing(tmp_path, capsys):
    net = _bn_net()
    csx.performance.micro_batch_size = "explore"
    _, step = _setup(net, tmp_path)
    before = {k: v.detach().clone() for k, v in net.state_dict().items()}
    loss, _ = step(*_data(8))
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8]
    assert "failed: Expected more than 1 value per channel" in out   # BatchNorm on 1 sample
    program = _program(step)
    assert program.explored.best in (2, 4, 8) and f"best: {program.explored.best}" in out
    assert np.isfinite(float(loss))
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in net.parameters())


def test_explore_bounds_and_per_step_dict(tmp_path, capsys):
    csx.performance.micro_batch_size = {"training_step": {"explore": {"min": 4}},
                                        "eval_step": None}
    assert micro_batch.setting("eval_step") is None
    assert micro_batch.setting("other_step") == "auto"   # the flag's default
    _, step = _setup(_bn_net(), tmp_path)
    step(*_data(8))
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()
            if re.match(r"\s+\d+\s+\d+\s", line)]
    assert rows == ["4", "8"]
    csx.performance.micro_batch_size = {"training_step": 4}
    assert micro_batch.setting("training_step") == 4
    with pytest.raises(ValueError, match="keyed by traced step function name"):
        csx.performance.micro_batch_size = {"training_step": {"micro": 4}}


def test_reading_the_batch_after_backward_is_refused(tmp_path):
    csx.performance.micro_batch_size = 4
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    model = nn.Linear(6, 3)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        loss = F.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return F.cross_entropy(compiled(x), y)   # the updated model on the batch

    with pytest.raises(ValueError, match="per-sample values of the batch .* after "
                                         "loss.backward"):
        step(*_data(8))


def test_auto_runs_whole_a_step_that_cannot_be_split(tmp_path, capsys):
    csx.debug.act_memory_gi = 1 / 2 ** 30   # one byte: nothing fits
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    model = nn.Linear(6, 3)
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        loss = F.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return F.cross_entropy(compiled(x), y)

    after = step(*_data(8))
    assert np.isfinite(float(after)) and _program(step).micro_batch_size is None
    assert "cannot be micro-batched" in capsys.readouterr().err


def test_an_optimizer_step_before_the_last_backward_is_refused(tmp_path):
    csx.performance.micro_batch_size = 4
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    model = nn.Linear(6, 3)
    compiled = cstorch.compile(model, backend)
    first = cstorch.optim.SGD(model.parameters(), lr=0.1)
    second = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        for optimizer in (first, second):
            loss = F.cross_entropy(compiled(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return loss

    with pytest.raises(ValueError, match=r"backward\(\) is called after optimizer.step\(\)"):
        step(*_data(8))


def test_cpu_backend_ignores_the_flag_with_a_warning(tmp_path):
    csx.performance.micro_batch_size = 4
    _, step = _setup(_bn_net(), tmp_path, kind="CPU")
    with pytest.warns(UserWarning, match="ignored on the CPU backend"):
        step(*_data(8))
    assert _program(step).micro_batch_size is None


def test_an_eval_step_runs_per_micro_batch_and_joins_outputs(tmp_path):
    net = _bn_net().eval()
    csx.performance.micro_batch_size = 2
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    compiled = cstorch.compile(net, backend)

    @cstorch.trace
    def eval_step(x):
        out = compiled(x)
        return out, out.mean()

    x, _ = _data(8)
    out, mean = eval_step(x)
    with torch.no_grad():
        expected = net(x)
    assert _program(eval_step).micro_batch_size == 2
    assert torch.allclose(out, expected, atol=1e-6)
    assert abs(float(mean) - float(expected.mean())) < 1e-6


# --- the acceptance run: a GPT on the 2x4 wafer (8 devices, in a subprocess) ------------

GPT = r"""
import json, re, sys, time
import torch
import importlib
import cerebras.pytorch as cstorch
from examples.train_gpt import TinyGPT, next_token_loss

cstorch.backends.csx.precision.optimization_level = 0   # float32 matmuls
# Several runs, each on a backend of its own: each replaces the last, as in the test suite.
importlib.import_module("cstorch.backend")._replacing_allowed = True

def run(size, steps, art):
    torch.manual_seed(0)
    cstorch.backends.csx.performance.micro_batch_size = size
    backend = cstorch.backend("CSX", artifact_dir=art)
    model = TinyGPT()
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.01)

    @cstorch.trace
    def training_step(tokens):
        loss = next_token_loss(compiled, tokens)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
        optimizer.step()
        return loss

    g = torch.Generator().manual_seed(1)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    losses, times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        losses.append(float(training_step(torch.randint(0, 61, (16, 17), generator=g))))
        times.append(time.perf_counter() - start)
    after = {k: v.detach().clone() for k, v in model.state_dict().items()}
    program = next(iter(training_step.programs.values()))[0]
    return losses, before, after, program, times, backend

mode, art = sys.argv[1], sys.argv[2]
result = {}
if mode == "parity":
    whole, _, w_after, w_prog, w_times, backend = run(None, 3, art + "/whole")
    split, _, s_after, s_prog, s_times, _ = run(4, 3, art + "/split")
    hlo = s_prog.compiled.executable.as_text()
    result = {
        "mesh": dict(backend.mesh.shape), "whole": whole, "split": split,
        "max_abs_rel": {k: float((s_after[k] - w_after[k]).abs().max()
                                 / w_after[k].abs().max().clamp_min(1e-12)) for k in w_after},
        "norm_rel": {k: float((s_after[k] - w_after[k]).double().norm()
                              / w_after[k].double().norm().clamp_min(1e-12)) for k in w_after},
        "whiles": len(re.findall(r"\bwhile\(", hlo)),
        "trip_counts": re.findall(r'"known_trip_count":\{"n":"(\d+)"\}', hlo),
        "whole_hlo_whiles": len(re.findall(r"\bwhile\(", w_prog.compiled.executable.as_text())),
        "micro_batch_size": s_prog.micro_batch_size,
        "first_step_s": [w_times[0], s_times[0]],
        "later_step_s": [min(w_times[1:]), min(s_times[1:])],
    }
else:
    cstorch.backends.csx.performance.micro_batch_size = {"explore": {"min": 4}}
    _, before, after, program, times, _ = run({"explore": {"min": 4}}, 1, art + "/explore")
    result = {"identical": all(torch.equal(before[k], after[k]) for k in before),
              "best": program.explored.best,
              "rows": [[r.micro_batch_size, r.compile_s, r.step_s, r.peak_bytes]
                       for r in program.explored.rows]}
print(json.dumps(result))
"""


def _gpt(mode, tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", GPT, mode, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_gpt_on_the_2x4_wafer_micro_batched_equals_the_whole_batch(tmp_path):
    _, r = _gpt("parity", tmp_path)
    assert r["mesh"] == {"systems": 1, "rows": 2, "cols": 4}
    assert r["micro_batch_size"] == 4
    for a, b in zip(r["split"], r["whole"]):
        assert abs(a - b) <= 1e-5 * abs(b)
    # Parameter by parameter, as ||split - whole|| / ||whole||; the largest single-element
    # difference relative to the tensor's largest value is recorded in docs/micro-batching.md.
    worst = max(r["norm_rel"].values())
    assert worst <= 1e-5, r["norm_rel"]
    assert r["whiles"] == r["whole_hlo_whiles"] + 1 and r["trip_counts"].count("4") == 1
    print(json.dumps(r))


@pytest.mark.slow
def test_gpt_explore_on_the_2x4_wafer_prints_three_candidates_and_trains_nothing(tmp_path):
    out, r = _gpt("explore", tmp_path)
    assert [row[0] for row in r["rows"]] == [4, 8, 16]
    assert "micro_batch_size explore for training_step" in out and "best:" in out
    assert r["identical"]
    print(json.dumps(r))


def test_each_micro_batch_draws_its_own_dropout_mask(tmp_path):
    """Random ops draw from fold_in(step key, i) in micro-batch i: with one key shared, the
    two halves of the batch below would get the very same mask."""
    model = nn.Sequential(nn.Linear(6, 64), nn.Dropout(0.5))
    torch.manual_seed(0)
    backend, training_step = _setup(model, tmp_path)
    csx.performance.micro_batch_size = 2
    x = torch.randn(2, 6).repeat(2, 1)   # micro-batch 1 holds the same rows as micro-batch 0
    _, out = training_step(x, torch.zeros(4, dtype=torch.long))
    assert training_step.programs and next(iter(training_step.programs.values()))[0] \
        .micro_batch_size == 2
    kept_first, kept_second = out[:2] != 0, out[2:] != 0
    assert 0.3 < kept_first.float().mean() < 0.7   # dropout did run
    assert not torch.equal(kept_first, kept_second)
