"""A fast slice of the OpInfo conformance run (`python -m tools.conformance` runs it all).

Every entry named here must be tried and pass: an entry that became excluded or
unsupported fails the test rather than passing unseen.
"""
import pytest
import torch

import tools.conformance as conformance

# One or two entries per family, a few samples each (spread over the entry's list).
FAST = ["add", "mul", "div.floor_rounding", "div.trunc_rounding", "remainder", "pow", "exp",
        "sigmoid", "where", "clamp", "sum", "mean", "amax", "argmax", "softmax", "cumsum",
        "sort", "topk", "matmul", "addmm", "nn.functional.conv2d", "nn.functional.max_pool2d",
        "nn.functional.avg_pool2d", "nn.functional.layer_norm", "nn.functional.embedding",
        "gather", "index_select", "cat", "permute", "flip", "tril", "nn.functional.gelu",
        "median", "linalg.solve", "special.i1", "nn.functional.interpolate.bilinear",
        # entries with a comparison rule, complex intermediates, or a hand-written kernel
        "linalg.eigh", "linalg.svd", "fft.rfft", "special.bessel_y0", "polygamma.polygamma_n_1",
        "scatter_add", "index_put", "histogram", "nn.functional.grid_sample", "searchsorted",
        "nn.functional.cross_entropy", "nn.functional.fractional_max_pool2d", "nonzero",
        # deterministic samples of ops named like random ones are compared by value
        "nn.functional.dropout", "nn.functional.normalize", "native_layer_norm"]
# nonzero has a data-dependent output shape: it must be refused, never lowered wrong.
REFUSED = {"nonzero"}
# Other dtypes: integer arithmetic (rounding, promotion), bool logic, reduced precision.
FAST_DTYPES = [("div.floor_rounding", torch.int32), ("remainder", torch.int64),
               ("bitwise_xor", torch.int32), ("sum", torch.int64), ("logical_and", torch.bool),
               ("where", torch.bool), ("add", torch.bfloat16), ("matmul", torch.bfloat16),
               ("softmax", torch.float16), ("nn.functional.layer_norm", torch.bfloat16)]
# Gradients of every input: elementwise, reductions, matmul, conv, norms, pooling,
# indexing, losses, a random op.
FAST_BACKWARD = ["mul", "div.no_rounding_mode", "exp", "softmax", "sum", "matmul",
                 "nn.functional.conv2d", "nn.functional.layer_norm", "nn.functional.max_pool2d",
                 "gather", "nn.functional.cross_entropy", "cumsum", "nn.functional.dropout",
                 "linalg.svd"]

ENTRIES = conformance.op_entries(FAST)
BY_NAME = {conformance.entry_name(op): op
           for op in conformance.op_entries([n for n, _ in FAST_DTYPES] + FAST_BACKWARD)}


def test_fast_subsets_are_found():
    assert {conformance.entry_name(op) for op in ENTRIES} >= set(FAST)
    assert set(BY_NAME) >= set(FAST_BACKWARD) | {n for n, _ in FAST_DTYPES}


@pytest.mark.parametrize("op", ENTRIES, ids=conformance.entry_name)
def test_opinfo_float32(op):
    result = conformance.run_entry(op, torch.float32, max_samples=2, timeout=60)
    want = "refused" if conformance.entry_name(op) in REFUSED else "pass"
    assert result.status == want, f"{result.status}: {result.detail}"


@pytest.mark.parametrize("name,dtype", FAST_DTYPES, ids=[f"{n}-{str(d)[6:]}" for n, d in FAST_DTYPES])
def test_opinfo_other_dtypes(name, dtype):
    result = conformance.run_entry(BY_NAME[name], dtype, max_samples=2, timeout=60)
    assert result.status == "pass", f"{result.status}: {result.detail}"


@pytest.mark.parametrize("name", FAST_BACKWARD)
def test_opinfo_backward_float32(name):
    result = conformance.run_entry(BY_NAME[name], torch.float32, max_samples=2, timeout=60,
                                   mode="backward")
    assert result.status == "pass", f"{result.status}: {result.detail}"


def test_only_skips_exclude():
    # PyTorch lists a toleranceOverride among these entries' skips: not a reason to skip.
    for name in ("native_layer_norm", "nn.functional.multi_head_attention_forward"):
        op = conformance.op_entries([name])[0]
        assert conformance.excluded_reason(op, torch.float32) is None
    normal = next(op for op in conformance.op_entries(["normal"]) if not op.variant_test_name)
    reason = conformance.run_entry(normal, torch.float32, mode="backward").detail
    assert reason == "skip('Gradients are incorrect!') in TestBwdGradients"


def test_dtype_check_compares_before_casting():
    import jax.numpy as jnp

    from tools.conformance.compare import as_eager
    assert as_eager(jnp.zeros(2, jnp.int32), torch.zeros(2, dtype=torch.int64)).dtype == torch.int64
    with pytest.raises(AssertionError, match="dtype"):
        as_eager(jnp.zeros(2, jnp.int32), torch.zeros(2))


def test_values_are_compared_unless_the_graph_draws():
    import bridge
    from tools.conformance.samples import _random
    dropout = conformance.op_entries(["nn.functional.dropout"])[0]
    x = torch.ones(4)
    for training, draws in ((False, False), (True, True)):
        gm = bridge.capture(lambda t: [torch.nn.functional.dropout(t, 0.5, training)], [x])  # noqa: B023 (captured within this iteration)
        assert _random(dropout, gm) is draws


def test_an_excluded_entry_run_anyway_keeps_its_outcome_beside_the_exclusion():
    """`--run-excluded`: as_strided.partial_views' backward is excluded by PyTorch; run
    anyway, it passes now that prims::as_strided_scatter has a lowering, and the report
    counts it in the rate with excluded entries counted, not in the usual one."""
    from tools.conformance.report import summary, with_excluded
    op = next(op for op in conformance.op_entries(["as_strided_scatter"]))
    skipped = conformance.run_entry(op, torch.float32, max_samples=2, mode="backward")
    assert skipped.status == "excluded" and not skipped.excluded_outcome
    ran = conformance.run_entry(op, torch.float32, max_samples=2, mode="backward",
                                run_excluded=True)
    assert ran.status == "excluded" and ran.detail == skipped.detail
    assert ran.excluded_outcome in ("pass", "no-samples"), ran.excluded_detail
    passed = conformance.EntryResult("x", "float32", "backward", "pass")
    counts = summary([ran, passed, skipped])[("backward", "float32")]
    assert counts["pass"] == 1 and counts["excluded"] == 2
    assert with_excluded(counts) == (1 + (ran.excluded_outcome == "pass"), 3)
