"""Where a training step spends its time, op family by op family: eager PyTorch against the
compiled XLA program of the cstorch traced step.

    python -m benchmarks.op_families [--workloads gpt-small,transformer-lm,cnn] [--steps 5]
                                     [--no-write]

Each workload runs in a fresh process (one cstorch backend per process). Eager PyTorch is
profiled with `torch.profiler` (self CPU time of each ATen op; ops under the optimizer's
`Optimizer.step` region count as the optimizer update). The cstorch step is profiled with
JAX's profiler: XLA's CPU runtime records one event per executed instruction (a fusion, a
library call such as a YNNPACK dot, a copy), and the optimised HLO the CPU backend writes to
its artifact directory names, in each instruction's metadata, the ATen op it was lowered
from and the user's line; instructions from the step's `optimizer.step()` line count as the
optimizer update. Both sides are sums of kernel time per step: XLA may run two
instructions at once on the two cores, and eager ops use both cores inside one op, so a
column's total is not the wall time (printed beside it, measured without a profiler).
"""
import argparse
import collections
import copy
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "OP-FAMILIES-RESULT "
DEFAULT = ("gpt-small", "transformer-lm", "cnn")

FAMILIES = ("matmul (linear layers)", "attention (batched matmuls, softmax)",
            "convolution and pooling", "normalisation", "embedding and its gradient",
            "loss (log-softmax, NLL)", "elementwise (activations, masks, residuals)",
            "layout (transposes, copies, concatenation)", "optimizer update")

_ATEN_FAMILY = {
    "matmul (linear layers)": "mm addmm linear matmul dot",
    # A causal mask's masked_fill is a `where` after decomposition, like a ReLU's gradient:
    # both count as elementwise.
    "attention (batched matmuls, softmax)":
        "bmm baddbmm _softmax softmax _softmax_backward_data "
        "scaled_dot_product_attention _scaled_dot_product_flash_attention_for_cpu "
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    "convolution and pooling": "convolution convolution_backward mkldnn_convolution conv2d "
                               "max_pool2d_with_indices max_pool2d_with_indices_backward "
                               "avg_pool2d avg_pool2d_backward adaptive_avg_pool2d "
                               "_adaptive_avg_pool2d _adaptive_avg_pool2d_backward mean",
    "normalisation": "native_layer_norm native_layer_norm_backward native_batch_norm "
                     "native_batch_norm_backward _native_batch_norm_legit "
                     "_native_batch_norm_legit_functional _native_batch_norm_legit_no_training "
                     "batch_norm_backward layer_norm batch_norm rsqrt var_mean",
    "embedding and its gradient": "embedding embedding_backward embedding_dense_backward "
                                  "index_select index_put _index_put_impl_ index_add "
                                  "scatter_add index gather",
    "loss (log-softmax, NLL)": "_log_softmax log_softmax _log_softmax_backward_data nll_loss "
                               "nll_loss_forward nll_loss_backward cross_entropy",
    "layout (transposes, copies, concatenation)":
        "transpose permute t view reshape _unsafe_view clone copy copy_ _to_copy contiguous "
        "expand cat concatenate split slice select alias as_strided unsqueeze squeeze "
        "detach _reshape_alias",
}
ATEN_FAMILY = {op: fam for fam, ops in _ATEN_FAMILY.items() for op in ops.split()}


def family(op: str) -> str:
    """The family of ATen op `op` (a name such as ``addmm``), elementwise by default."""
    return ATEN_FAMILY.get(op, "elementwise (activations, masks, residuals)")


# Eager PyTorch ---------------------------------------------------------------------------
def _eager_op(name: str):
    return name[len("aten::"):] if name.startswith("aten::") else None


def eager_profile(workload, model, batches):
    """({family: self CPU ms per step}, {(a shape, b shape): self CPU ms per step of the
    matrix products}) of eager PyTorch over `batches`."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks import peers
    run = peers.eager(workload, model)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for b in batches:
            run(*b, True)
    out, products = collections.Counter(), collections.Counter()
    for e in prof.events():
        op = _eager_op(e.name)
        if op is None:
            continue
        if op in ("mm", "addmm", "bmm"):
            a, b = e.input_shapes[-4:-2] if op == "addmm" else e.input_shapes[:2]
            products[(tuple(a), tuple(b))] += e.self_cpu_time_total / 1e3 / len(batches)
        parent, in_optimizer = e.cpu_parent, False
        while parent is not None:
            if parent.name.startswith("Optimizer.step"):
                in_optimizer = True
                break
            parent = parent.cpu_parent
        fam = "optimizer update" if in_optimizer else family(op)
        out[fam] += e.self_cpu_time_total / 1e3 / len(batches)
    return dict(out), products


def isolated_products(shapes, repeats=5, calls=20):
    """[(a shape, b shape, torch ms, XLA ms)]: each matrix product timed alone, eager
    `torch.matmul` against a jitted `jnp.matmul` (medians of `repeats` x `calls`)."""
    import jax
    import jax.numpy as jnp
    import torch

    def timed(f):
        f()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(calls):
                f()
            times.append((time.perf_counter() - start) * 1e3 / calls)
        return statistics.median(times)
    rows = []
    for a, b in shapes:
        x, y = torch.randn(a), torch.randn(b)
        jx, jy = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
        product = jax.jit(jnp.matmul)
        rows.append((a, b, timed(lambda: torch.matmul(x, y)),  # noqa: B023 (timed within this iteration)
                     timed(lambda: product(jx, jy).block_until_ready())))  # noqa: B023 (timed within this iteration)
    return rows


# The cstorch step ------------------------------------------------------------------------
_DEFINED = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = \S+ ([\w\-]+)\(")
_OP_NAME = re.compile(r"metadata=\{op_name=\"([^\"]*)\"")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) \(")
_ATEN = re.compile(r"aten\.([A-Za-z0-9_]+)\.")


def hlo_op_names(hlo_text: str) -> dict:
    """{instruction name: the op_name it is charged to}: its own metadata, or for a fusion
    that holds a dot (XLA's CPU library fusions put a reduction or an activation after a
    matmul) the dot's, so a matmul counts as a matmul whatever was fused into it; "" for an
    instruction XLA made itself."""
    own, calls, dots, computation = {}, {}, {}, None
    for line in hlo_text.splitlines():
        m = _COMPUTATION.match(line)
        if m:
            computation = m.group(1)
            continue
        m = _DEFINED.match(line)
        if not m:
            continue
        name, opcode = m.groups()
        op_name = _OP_NAME.search(line)
        own[name] = op_name.group(1) if op_name else ""
        called = _CALLS.search(line)
        if called:
            calls[name] = called.group(1)
        if opcode in ("dot", "convolution"):
            # XLA builds some products without metadata (the weight gradients of
            # convolutions): charged to their kind of op all the same.
            made = "aten.convolution_backward." if opcode == "convolution" else "aten.mm."
            dots.setdefault(computation, op_name.group(1) if op_name else f"(made by XLA) {made}")
    return {name: dots.get(calls.get(name), op) for name, op in own.items()}


def classify_instruction(op_name: str, optimizer_line: str) -> str:
    if optimizer_line in op_name:
        return "optimizer update"
    m = _ATEN.search(op_name)
    return family(m.group(1)) if m else "layout (transposes, copies, concatenation)"


def cstorch_profile(step_run, batches, hlo_text: str, optimizer_line: str):
    """({family: kernel ms per step}, [(ms per step, instruction, op_name)] heaviest first)
    of the compiled step over `batches`."""
    from jax._src.lib import _profile_data, _profiler
    names = hlo_op_names(hlo_text)
    session = _profiler.ProfilerSession(_profiler.ProfileOptions())
    for b in batches:
        step_run(*b, True)
    data = _profile_data.ProfileData.from_serialized_xspace(session.stop())
    per_instruction = collections.Counter()
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name == "python":
                continue
            for e in line.events:
                if e.name in names:
                    per_instruction[e.name] += e.duration_ns / 1e6 / len(batches)
    out = collections.Counter()
    for name, ms in per_instruction.items():
        out[classify_instruction(names[name], optimizer_line)] += ms
    top = [(ms, name, names[name]) for name, ms in per_instruction.most_common(12)]
    return dict(out), top


def _wall(run, batches, repeats=3):
    """{"ms": wall ms per step (median of `repeats` passes), "faults": minor page faults
    per step, "sys_ms": system CPU ms per step} of `run` over `batches`, unprofiled."""
    import resource
    times = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(repeats):
        start = time.perf_counter()
        for b in batches:
            run(*b, True)
        times.append((time.perf_counter() - start) * 1e3 / len(batches))
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = repeats * len(batches)
    return {"ms": statistics.median(times), "faults": (after.ru_minflt - before.ru_minflt) / n,
            "sys_ms": (after.ru_stime - before.ru_stime) * 1e3 / n}


def measure(name: str, steps: int) -> dict:
    import torch  # noqa: F401 - imported before the peers build models

    from benchmarks import peers, workloads
    wl = workloads.load(name)
    base = wl.make_model()
    data = wl.batches(steps + 3)
    warm, timed = data[:3], data[3:]

    step = peers.cstorch_step(wl, copy.deepcopy(base))
    cstorch_run = peers.reading(step)
    for b in warm:
        cstorch_run(*b, True)
    source, first = inspect.getsourcelines(peers.cstorch_step)
    offset = next(i for i, line in enumerate(source) if "optimizer.step()" in line)
    optimizer_line = f"peers.py:{first + offset}"
    hlo_path = os.path.join(peers.CSTORCH_ARTIFACTS, "step.hlo.txt")
    with open(hlo_path) as f:
        hlo_text = f.read()
    cs, top = cstorch_profile(cstorch_run, timed, hlo_text, optimizer_line)
    cs_wall = _wall(cstorch_run, timed)

    eager_model = copy.deepcopy(base)
    eager_run = peers.eager(wl, eager_model)
    for b in warm:
        eager_run(*b, True)
    eg, products = eager_profile(wl, eager_model, timed)
    eg_wall = _wall(eager_run, timed)
    ranked = [shapes for shapes, _ in products.most_common()]
    heaviest = ([s for s in ranked if len(s[0]) == 2][:3]
                + [s for s in ranked if len(s[0]) == 3][:2])
    return {"workload": name, "title": wl.TITLE, "steps": steps, "eager": eg, "cstorch": cs,
            "eager_wall": eg_wall, "cstorch_wall": cs_wall,
            "top": [[round(ms, 3), n, op] for ms, n, op in top],
            "products": [list(r) for r in isolated_products(heaviest)]}


def in_subprocess(name: str, steps: int) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.op_families", "--one", name,
                           "--steps", str(steps)], env=env, cwd=ROOT, capture_output=True,
                          text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")


def table(r: dict) -> str:
    ew, cw = r["eager_wall"], r["cstorch_wall"]
    rows = [f"#### {r['workload']}: {r['title']}", "",
            f"Without a profiler (median of 3 passes of {r['steps']} steps): eager "
            f"{ew['ms']:.1f} ms/step, cstorch {cw['ms']:.1f} ms/step; minor page faults per "
            f"step: eager {ew['faults']:.0f}, cstorch {cw['faults']:.0f}; system CPU time per "
            f"step: eager {ew['sys_ms']:.1f} ms, cstorch {cw['sys_ms']:.1f} ms.", "",
            "| op family | eager PyTorch (ms/step) | cstorch XLA program (ms/step) "
            "| cstorch - eager (ms) |", "| --- | ---: | ---: | ---: |"]
    eager, cs = r["eager"], r["cstorch"]
    for fam in FAMILIES:
        e, c = eager.get(fam, 0.0), cs.get(fam, 0.0)
        if e < 0.05 and c < 0.05:
            continue
        rows.append(f"| {fam} | {e:.1f} | {c:.1f} | {c - e:+.1f} |")
    te, tc = sum(eager.values()), sum(cs.values())
    rows.append(f"| sum of kernel time | {te:.1f} | {tc:.1f} | {tc - te:+.1f} |")
    rows += ["", "Heaviest XLA instructions (ms/step, instruction, the op it was lowered "
             "from):", ""]
    for ms, name, op in r["top"][:8]:
        rows.append(f"- {ms:.2f} ms `{name}` {('`' + op + '`') if op else '(made by XLA)'}")
    rows += ["", "The heaviest matrix and batched-matrix products of the eager step, each timed alone "
             "(torch.matmul against a jitted jnp.matmul, median of 5 x 20 calls):", "",
             "| a | b | torch (ms) | XLA (ms) | XLA / torch |", "| --- | --- | ---: | ---: | ---: |"]
    for a, b, t, x in r["products"]:
        rows.append(f"| {list(a)} | {list(b)} | {t:.2f} | {x:.2f} | {x / t:.2f} |")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.op_families")
    parser.add_argument("--workloads", default=",".join(DEFAULT))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.one:
        print(MARK + json.dumps(measure(args.one, args.steps)), flush=True)
        return
    from benchmarks._report import steal_since, write_section
    parts, cpu = [], psutil.cpu_times()
    for name in args.workloads.split(","):
        r = in_subprocess(name, args.steps)
        parts.append(table(r))
        print(parts[-1] + "\n", flush=True)
    if not args.no_write:
        from benchmarks.__main__ import machine
        write_section("op_families", f"`python -m benchmarks.op_families --workloads "
                      f"{args.workloads} --steps {args.steps}` on {machine()}; "
                      f"{steal_since(cpu)} during the run.\n\n" + "\n\n".join(parts))


if __name__ == "__main__":
    main()
