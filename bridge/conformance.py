"""Conformance of the lowerings with eager PyTorch, over PyTorch's own OpInfo suite.

For each `op_db` entry and each of its sample inputs the op is captured with
`bridge.capture` (tensors of the sample become graph inputs, everything else is baked in),
lowered with `bridge.lower`, run under `jax.jit`, and compared with eager PyTorch on CPU.

Outcomes per sample:
- pass     the JAX result matches eager within the dtype's tolerance
- fail     capture succeeded but lowering, JAX tracing or the comparison failed
- refused  PyTorch's own tracer refused the op (data-dependent shapes, `.item()`, ...),
           so there is no graph to lower, or a lowering raised `DataDependentShapeError`
           (an output shape that depends on values); it counts against the pass rate
An entry passes in a dtype when every sample passes. Entries that PyTorch itself marks as
skipped or expected-failing on CPU for tracing/decomposition tests are excluded and listed,
as are entries that do not support the dtype on CPU.

Run ``python -m bridge.conformance`` for the full run (writes docs/op-coverage.md).
"""
import argparse
import contextlib
import signal
import sys
import time
import traceback
import unittest
from dataclasses import dataclass, field
from pathlib import Path

import jax
import torch
from torch.utils import _pytree as pytree

import bridge
from bridge.convert import jax_to_tensor, tensor_to_jax
from bridge.errors import DataDependentShapeError

# (rtol, atol): a little looser than torch.testing's defaults, since XLA and ATen use
# different (both correct to a few ulp) transcendental kernels and reduction orders.
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float64: (1e-4, 1e-5),  # computed in float32 with x64 off
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}

# The OpInfo test classes whose CPU skips/xfails say "this op cannot be traced or
# decomposed faithfully": an entry PyTorch excludes there is excluded here too.
_TRACING_TESTS = [
    ("TestDecomp", "test_comprehensive"), ("TestDecomp", "test_quick"),
    ("TestProxyTensorOpInfo", "test_make_fx_exhaustive"),
    ("TestProxyTensorOpInfo", "test_make_fx_fake_exhaustive"),
    ("TestFakeTensor", "test_fake"), ("TestFakeTensor", "test_fake_autocast"),
]
# Ops whose values are random: only shape and dtype are compared. The randomized
# low-rank SVDs belong here: for an input of rank > q their answer depends on the draw.
_RANDOM_IN_TRAINING = ("nn.functional.rrelu",)  # a random slope per element in training
_RANDOM_WORDS = ("lowrank", "fractional_max_pool", "dropout", "bernoulli", "normal", "uniform", "rand", "multinomial", "cauchy",
                 "exponential", "geometric", "log_normal", "empty", "new_empty")


def _eigh_invariant(outs):
    # Eigenvectors are unique only up to sign (and any rotation inside a repeated
    # eigenvalue's space): compare the eigenvalues and the reconstruction V diag(w) V^T.
    w, v = outs
    return [w, (v * w[..., None, :]) @ v.mT]


def _svd_invariant(v_is_transposed):
    # Singular vectors are unique only up to sign (and a rotation within a repeated
    # singular value): compare S and the reconstruction U diag(S) V^T, which are unique.
    def rule(outs):
        u, s, v = outs
        if u.numel() == 0 or v.numel() == 0:  # compute_uv=False: S alone
            return [s]
        k = s.shape[-1]
        vt = v[..., :k, :] if v_is_transposed else v[..., :, :k].mT
        return [s, (u[..., :, :k] * s[..., None, :]) @ vt]
    return rule


def _normwise(outs):
    # exp(A) has entries ~1e5 for the samples' |A| ~ 9; both kernels are accurate to
    # float32 eps * ||exp(A)|| (checked against float64), not elementwise to each entry.
    return [o / torch.linalg.matrix_norm(o)[..., None, None] for o in outs]


# Per-entry comparison rules, for outputs that are correct but not unique (or whose
# error is only meaningful in a norm): both eager's and our outputs go through the rule.
COMPARE_RULES = {
    "linalg.eigh": _eigh_invariant,
    "svd": _svd_invariant(v_is_transposed=False),
    "linalg.svd": _svd_invariant(v_is_transposed=True),
    "matrix_exp": _normwise,
}


def _is_skip(decorator) -> bool:
    if decorator is unittest.expectedFailure:
        return True
    name = getattr(decorator, "__qualname__", "") + getattr(decorator, "__name__", "")
    return "skip" in name.lower() or "expectedFailure" in name


def excluded_reason(op, dtype) -> str | None:
    """Why PyTorch's own suite skips `op` in `dtype` on CPU for tracing tests, or None."""
    from torch.testing._internal.common_device_type import onlyCUDA
    if any(d is onlyCUDA for d in op.decorators or ()):
        return "onlyCUDA (PyTorch's suite never runs it on CPU)"
    for kind, infos in (("skip", op.skips or ()), ("decorator", op.decorators or ())):
        for info in infos:
            if not hasattr(info, "is_active"):
                continue
            decorators = info.decorators if hasattr(info, "decorators") else [info.decorator]
            if kind == "decorator" and not any(_is_skip(d) for d in decorators):
                continue
            for cls, test in _TRACING_TESTS:
                try:
                    active = info.is_active(cls, test, "cpu", dtype, {})
                except Exception:
                    active = False
                if active:
                    return f"{info.cls_name}.{info.test_name}"
    return None


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


class _SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds):
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise _SampleTimeout(f"sample took longer than {seconds}s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(seconds))
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _tensors_of(value):
    # A complex output is compared as its (real, imag) pairs: the graph keeps complex
    # intermediates (FFTs), only the boundary to eager PyTorch is real. An op that returns
    # only Python numbers (`item`, `equal`, `allclose`) is compared as 0-d tensors of
    # them; tracing it normally fails on the value read, which counts as refused.
    leaves = pytree.tree_leaves(value)
    tensors = [torch.view_as_real(v.resolve_conj()) if v.is_complex() and v.layout == torch.strided
               else v for v in leaves if isinstance(v, torch.Tensor)]
    if not tensors:
        tensors = [torch.as_tensor(v) for v in leaves if isinstance(v, (bool, int, float))]
    return tensors


def _compare(expected, got, dtype, random):
    if expected.shape != got.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != eager {tuple(expected.shape)}")
    if expected.dtype != got.dtype:
        raise AssertionError(f"dtype {got.dtype} != eager {expected.dtype}")
    if random or expected.numel() == 0:
        return
    rtol, atol = TOLERANCES.get(expected.dtype, (0, 0))
    if expected.dtype == torch.float64 or expected.dtype == torch.float32:
        rtol, atol = TOLERANCES[torch.float32]
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True,
                               check_dtype=False)


def run_sample(op, sample, dtype) -> tuple[str, str]:
    """('pass' | 'fail' | 'refused' | 'skip', detail) for one sample input of `op`."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    where = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    if any(leaves[i].is_complex() or leaves[i].layout != torch.strided for i in where):
        return "skip", "complex or sparse input"
    inputs = [leaves[i].detach().clone() for i in where]

    def call(*tensors):
        filled = list(leaves)
        for i, t in zip(where, tensors):
            filled[i] = t
        inp, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op(inp, *args, **kwargs)

    try:
        expected_tree = call(*[t.clone() for t in inputs])
    except Exception as e:
        return "skip", f"eager raised {type(e).__name__}"
    expected = _tensors_of(expected_tree)
    if not expected or any(e.is_complex() or e.layout != torch.strided for e in expected):
        return "skip", "no real dense tensor output"

    try:
        gm = bridge.capture(lambda *ts: _tensors_of(call(*ts)), inputs)
    except bridge.LoweringError as e:
        return "fail", f"LoweringError: {str(e).splitlines()[0]}"
    except Exception as e:
        return "refused", f"capture: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    try:
        fn = bridge.lower(gm)
        outs = jax.jit(fn)(*[tensor_to_jax(t) for t in inputs], key=jax.random.key(0))
        got = [jax_to_tensor(o, e.dtype) for o, e in zip(outs, expected)]
        if len(got) != len(expected):
            raise AssertionError(f"{len(got)} outputs != eager {len(expected)}")
        random = any(w in op.name for w in _RANDOM_WORDS) or (
            op.name in _RANDOM_IN_TRAINING and sample.kwargs.get("training", False))
        rule = COMPARE_RULES.get(entry_name(op))
        if rule is not None:
            expected, got = rule(expected), rule(got)
        for e, g in zip(expected, got):
            _compare(e, g, dtype, random)
    except DataDependentShapeError as e:
        # Traced, but the lowering has no static output shape for it: as good as a refusal.
        return "refused", f"lowering: {str(e).splitlines()[0][:200]}"
    except Exception as e:
        msg = str(e).strip().splitlines()
        return "fail", f"{type(e).__name__}: {' | '.join(msg[:3])[:300] if msg else ''}"
    return "pass", ""


@dataclass
class EntryResult:
    name: str
    dtype: str
    status: str  # pass | fail | refused | excluded | unsupported | no-samples
    samples: dict = field(default_factory=dict)
    detail: str = ""


def run_entry(op, dtype, max_samples=None, timeout=None) -> EntryResult:
    name, dname = entry_name(op), str(dtype).removeprefix("torch.")
    if not op.supports_dtype(dtype, "cpu"):
        return EntryResult(name, dname, "unsupported")
    reason = excluded_reason(op, dtype)
    if reason:
        return EntryResult(name, dname, "excluded", detail=reason)
    counts = {"pass": 0, "fail": 0, "refused": 0, "skip": 0}
    first_problem = first_skip = ""
    try:
        samples = op.sample_inputs("cpu", dtype, requires_grad=False)
        for i, sample in enumerate(samples):
            if max_samples is not None and i >= max_samples:
                break
            try:
                with _time_limit(timeout):
                    status, detail = run_sample(op, sample, dtype)
            except _SampleTimeout as e:
                status, detail = "fail", str(e)
            counts[status] += 1
            if status in ("fail", "refused") and not first_problem:
                first_problem = f"{status}: {detail}"
            elif status == "skip" and not first_skip:
                first_skip = detail
    except Exception as e:
        counts["skip"] += 1
        first_problem = first_problem or f"sample generation raised {type(e).__name__}"
    if counts["fail"]:
        status = "fail"
    elif counts["refused"]:
        status = "refused"
    elif counts["pass"]:
        status = "pass"
    else:
        status = "no-samples"
        first_problem = first_problem or first_skip
    return EntryResult(name, dname, status, counts, first_problem)


def op_entries(names=None):
    from torch.testing._internal.common_methods_invocations import op_db
    if not names:
        return list(op_db)
    wanted = set(names)
    return [op for op in op_db if entry_name(op) in wanted or op.name in wanted]


def _summary(results):
    by = {}
    for r in results:
        by.setdefault(r.dtype, {}).setdefault(r.status, 0)
        by[r.dtype][r.status] += 1
    return by


def write_report(results, path, command, seconds):
    by = _summary(results)
    lines = ["# Op coverage: bridge lowerings vs eager PyTorch on the OpInfo suite", "",
             "Generated by:", "", "```", command, "```", "",
             f"Wall time: {seconds / 60:.1f} min. Each `op_db` entry's sample inputs are captured "
             "with `bridge.capture`, lowered with `bridge.lower`, run under `jax.jit` and compared "
             "with eager PyTorch on CPU (tolerances and the per-op comparison rules for "
             "non-unique results in `bridge/conformance.py`). An entry passes when every sample "
             "tried passes. `tried` = entries that support the dtype on CPU, minus excluded; "
             "pass rate = passed / tried, so `refused` and `no-samples` count against it. "
             "`refused` = PyTorch's tracer produced no graph (data-dependent output shapes, "
             "Python values read from tensors) or a lowering raised `DataDependentShapeError`; "
             "`no-samples` = every sample had a complex or sparse input, or raised in eager.", "",
             "| dtype | entries | unsupported | excluded | tried | passed | failed | refused "
             "| no-samples | pass rate |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for dtype, c in by.items():
        tried = sum(c.get(k, 0) for k in ("pass", "fail", "refused", "no-samples"))
        rate = 100.0 * c.get("pass", 0) / max(tried, 1)
        lines.append(f"| {dtype} | {sum(c.values())} | {c.get('unsupported', 0)} | "
                     f"{c.get('excluded', 0)} | {tried} | {c.get('pass', 0)} | {c.get('fail', 0)} | "
                     f"{c.get('refused', 0)} | {c.get('no-samples', 0)} | {rate:.1f}% |")
    for title, status in (("Failed", "fail"), ("Refused", "refused"),
                          ("No usable samples", "no-samples"),
                          ("Excluded (PyTorch skips/xfails them on CPU)", "excluded")):
        rows = [r for r in results if r.status == status]
        lines += ["", f"## {title} ({len(rows)})", ""]
        lines += [f"- `{r.name}` ({r.dtype}): {r.detail.replace('|', '/')}" for r in rows]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32", help="comma list: " + ",".join(DTYPES))
    parser.add_argument("--ops", default="", help="comma list of entry names (default: all)")
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=120, help="seconds per sample")
    parser.add_argument("--report", default="docs/op-coverage.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dtypes = [DTYPES[d] for d in args.dtypes.split(",") if d]
    ops = op_entries([n for n in args.ops.split(",") if n])
    start, results = time.time(), []
    for op in ops:
        for dtype in dtypes:
            t0 = time.time()
            try:
                r = run_entry(op, dtype, args.max_samples, args.timeout)
            except Exception as e:
                r = EntryResult(entry_name(op), str(dtype), "fail",
                                detail=f"harness: {type(e).__name__}: {e}"[:300])
                traceback.print_exc()
            results.append(r)
            print(f"{r.status:11s} {r.dtype:9s} {r.name:45s} {r.samples} {time.time() - t0:.1f}s "
                  f"{r.detail}", flush=True)
    for dtype, c in _summary(results).items():
        print(f"TOTAL {dtype}: {c}")
    command = "python -m bridge.conformance " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.report:
        write_report(results, args.report, command.strip(), time.time() - start)
    return results


if __name__ == "__main__":
    main()
