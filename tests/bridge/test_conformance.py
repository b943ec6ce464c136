"""A fast slice of the OpInfo conformance run (`python -m bridge.conformance` runs it all)."""
import pytest

from bridge import conformance

# One or two entries per family, first samples only, to keep the default run short.
FAST = ["add", "mul", "div.floor_rounding", "div.trunc_rounding", "remainder", "pow", "exp",
        "sigmoid", "where", "clamp", "sum", "mean", "amax", "argmax", "softmax", "cumsum",
        "sort", "topk", "matmul", "addmm", "nn.functional.conv2d", "nn.functional.max_pool2d",
        "nn.functional.avg_pool2d", "nn.functional.layer_norm", "nn.functional.embedding",
        "gather", "index_select", "cat", "permute", "flip", "tril", "nn.functional.gelu",
        "median", "linalg.solve", "special.i1", "nn.functional.interpolate.bilinear"]
ENTRIES = conformance.op_entries(FAST)


def test_fast_subset_is_found():
    assert {conformance.entry_name(op) for op in ENTRIES} >= set(FAST)


@pytest.mark.parametrize("op", ENTRIES, ids=conformance.entry_name)
def test_opinfo_float32(op):
    import torch
    result = conformance.run_entry(op, torch.float32, max_samples=3, timeout=60)
    assert result.status in ("pass", "excluded", "unsupported"), result.detail
