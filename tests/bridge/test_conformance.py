"""A fast slice of the OpInfo conformance run (`python -m bridge.conformance` runs it all)."""
import pytest
import torch

from bridge import conformance

# One or two entries per family, first samples only, to keep the default run short.
FAST = ["add", "mul", "div.floor_rounding", "div.trunc_rounding", "remainder", "pow", "exp",
        "sigmoid", "where", "clamp", "sum", "mean", "amax", "argmax", "softmax", "cumsum",
        "sort", "topk", "matmul", "addmm", "nn.functional.conv2d", "nn.functional.max_pool2d",
        "nn.functional.avg_pool2d", "nn.functional.layer_norm", "nn.functional.embedding",
        "gather", "index_select", "cat", "permute", "flip", "tril", "nn.functional.gelu",
        "median", "linalg.solve", "special.i1", "nn.functional.interpolate.bilinear",
        # entries with a comparison rule, complex intermediates, or a hand-written kernel
        "linalg.eigh", "linalg.svd", "fft.rfft", "special.bessel_y0", "polygamma.polygamma_n_1",
        "scatter_add", "index_put", "histogram", "nn.functional.grid_sample",
        "nn.functional.cross_entropy", "nn.functional.fractional_max_pool2d", "nonzero"]
# Other dtypes: integer arithmetic (rounding, promotion), bool logic, reduced precision.
FAST_DTYPES = [("div.floor_rounding", torch.int32), ("remainder", torch.int64),
               ("bitwise_xor", torch.int32), ("sum", torch.int64), ("logical_and", torch.bool),
               ("where", torch.bool), ("add", torch.bfloat16), ("matmul", torch.bfloat16),
               ("softmax", torch.float16), ("nn.functional.layer_norm", torch.bfloat16)]
ENTRIES = conformance.op_entries(FAST)
BY_NAME = {conformance.entry_name(op): op for op in
           conformance.op_entries([name for name, _ in FAST_DTYPES])}


def test_fast_subset_is_found():
    assert {conformance.entry_name(op) for op in ENTRIES} >= set(FAST)


@pytest.mark.parametrize("op", ENTRIES, ids=conformance.entry_name)
def test_opinfo_float32(op):
    result = conformance.run_entry(op, torch.float32, max_samples=3, timeout=60)
    # nonzero has a data-dependent output shape: it must be refused, never lowered wrong
    allowed = ("refused",) if conformance.entry_name(op) == "nonzero" else ("pass",)
    assert result.status in allowed + ("excluded", "unsupported"), result.detail


@pytest.mark.parametrize("name,dtype", FAST_DTYPES, ids=[f"{n}-{str(d)[6:]}" for n, d in FAST_DTYPES])
def test_opinfo_other_dtypes(name, dtype):
    result = conformance.run_entry(BY_NAME[name], dtype, max_samples=3, timeout=60)
    assert result.status in ("pass", "excluded", "unsupported"), result.detail
