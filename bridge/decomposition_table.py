"""The decomposition table captured graphs are reduced with."""
import torch
from torch._decomp import core_aten_decompositions, decomposition_table

from bridge.ops import LOWERINGS


def decompositions():
    """The decomposition table captured graphs are reduced with.

    The core-ATen table, plus PyTorch's other decompositions for ops that have no lowering
    of their own (upsampling, grid sampling, `addmv`, ...): reusing PyTorch's rules beats
    hand-writing them, and an op with a lowering is never decomposed further.
    """
    # Building the table takes about half of a small capture; it changes only when the
    # set of lowerings does (the registry only adds, and refuses a second registration).
    stamp = len(LOWERINGS)
    if _decompositions[0] == stamp:
        return _decompositions[1]
    # The aten part of torch's table, as a plain dict: reading torch's table first looks up
    # every composite op of every other namespace (29 of them, 1.4 s of gpt-small's first
    # capture, profiled); their composite kernels decompose them while tracing anyway.
    torch_table = core_aten_decompositions()
    table = dict(getattr(torch_table, "decomp_table", torch_table))
    for op in _WRONG_DECOMPOSITIONS + _KEPT_WHOLE + _SAME_OP:
        if op in LOWERINGS:
            table.pop(op, None)
    for op, fn in decomposition_table.items():
        if (op not in table and op not in LOWERINGS and isinstance(op, torch._ops.OpOverload)
                and "out" not in op._overloadname and not op.name().endswith("_")):
            table[op] = fn
    _decompositions[:] = [stamp, table]
    return table


_decompositions = [None, None]   # [len(LOWERINGS) it was built for, the table]


# Core-ATen decompositions that compute something else than the op: the op's own lowering
# is used instead. multilabel_margin_loss_forward's also counts a frame's targets after
# its first -1, which end the frame's target list.
_WRONG_DECOMPOSITIONS = (torch.ops.aten.multilabel_margin_loss_forward.default,)


# Core-ATen decompositions whose op is cheaper lowered whole: CPU flash attention's
# forward and backward lowerings share the softmax (bridge/ops/attention.py).
_KEPT_WHOLE = (torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,)


# Core-ATen decompositions that only rename the op (`detach` becomes `alias`): each use
# would go through the tracer twice for the same lowering. Autograd detaches every
# parameter's gradient as it stores it, so a deep model's backward makes hundreds.
_SAME_OP = (torch.ops.aten.detach.default,)
