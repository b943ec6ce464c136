"""Which OpInfo entries PyTorch's own suite does not run on CPU, and why.

An entry is excluded only when PyTorch itself skips it, marks it an expected failure, or
runs it on CUDA only, in a test class whose subject is the one measured here: tracing and
decomposing an op (forward) and, for gradients, its backward. Everything else PyTorch
attaches to an entry (tolerance and precision overrides, CUDA/ROCm/XPU-only skips, skips
for builds without LAPACK or FFT, which this torch has) leaves the entry in the run.
"""
import unittest

# (test class, test) pairs whose CPU skips and expected failures mean "this op cannot be
# traced or decomposed faithfully".
TRACING_TESTS = (
    ("TestDecomp", "test_comprehensive"), ("TestDecomp", "test_quick"),
    ("TestProxyTensorOpInfo", "test_make_fx_exhaustive"),
    ("TestProxyTensorOpInfo", "test_make_fx_fake_exhaustive"),
    ("TestFakeTensor", "test_fake"), ("TestFakeTensor", "test_fake_autocast"),
)
# Gradients add PyTorch's own backward check: where eager autograd is known wrong or
# untestable, there is nothing trustworthy to compare with. (`TestGradients` is the base
# class; PyTorch instantiates the test under the name `TestBwdGradients`.)
GRADIENT_TESTS = TRACING_TESTS + (("TestBwdGradients", "test_fn_grad"),)


def _skip_reason(decorator) -> str | None:
    """PyTorch's wording when `decorator` stops a test from running on CPU, else None."""
    from torch.testing._internal.common_device_type import onlyCUDA
    if decorator is unittest.expectedFailure:
        return "expectedFailure"
    if decorator is onlyCUDA:
        return "onlyCUDA"
    # unittest.skip(reason) and a true unittest.skipIf(cond, reason) give this closure.
    if getattr(decorator, "__qualname__", "") == "skip.<locals>.decorator":
        cells = dict(zip(decorator.__code__.co_freevars, decorator.__closure__ or ()))
        reason = cells["reason"].cell_contents if "reason" in cells else ""
        return f"skip({reason!r})"
    return None


def excluded_reason(op, dtype, tests=TRACING_TESTS) -> str | None:
    """Why PyTorch's own suite does not run `op` in `dtype` on CPU in `tests`, or None.

    `op.decorators` already holds `op.skips` (OpInfo merges them); both are read, each
    decorator on its own merits, so a `toleranceOverride` listed among the skips is not
    taken for a skip.
    """
    seen = set()
    for info in (*(op.decorators or ()), *(op.skips or ())):
        if id(info) in seen:
            continue
        seen.add(id(info))
        if not hasattr(info, "is_active"):  # a bare decorator applies to every test
            reason = _skip_reason(info)
            if reason:
                return f"{reason} on every test"
            continue
        for decorator in info.decorators:
            reason = _skip_reason(decorator)
            if reason is None:
                continue
            for cls, test in tests:
                try:
                    active = info.is_active(cls, test, "cpu", dtype, {})
                except Exception:
                    active = False
                if active:
                    scope = (f"{info.cls_name}.{info.test_name}" if info.cls_name and info.test_name
                             else info.cls_name or "every test")
                    return f"{reason} in {scope}"
    return None
