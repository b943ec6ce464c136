"""The registry against PyTorch's core ATen opset (ops tagged `torch.Tag.core`)."""
import torch

from bridge.ops import LOWERINGS


def _symbolic(op):
    """Shape queries (`sym_size`, `sym_is_contiguous`, ...) return Python numbers, not
    tensors; they only appear with dynamic shapes, which bridge refuses before lowering.
    They have no lowering and are left out of the count, not counted as lowered."""
    return op._schema.name.split("::")[1].startswith("sym_")


def _writes_out(op):
    """An out= variant (PyTorch tags `atan2.out` core): captured graphs are functional and
    never hold one, and the registry does not lower them."""
    return any(a.is_out for a in op._schema.arguments)


def core_ops():
    """Every registered aten overload tagged core (all of them, not only those loaded)."""
    ops = []
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = qualified.partition("::")
        if namespace != "aten":
            continue
        name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        if torch.Tag.core in op.tags:
            ops.append(op)
    return ops


def test_core_aten_coverage():
    every = core_ops()
    left_out = sorted(str(op) for op in every if _symbolic(op) or _writes_out(op))
    ops = [op for op in every if not (_symbolic(op) or _writes_out(op))]
    assert len(ops) > 150
    missing = sorted(str(op) for op in ops if op not in LOWERINGS)
    covered = len(ops) - len(missing)
    print(f"\ncore ATen ops: {len(every)}; left out, as no graph holds them: {len(left_out)} "
          f"({', '.join(left_out)}); lowered: {covered} of {len(ops)} "
          f"({100 * covered / len(ops):.1f}%)")
    print("missing:", ", ".join(missing) or "none")
    assert not missing, f"{len(missing)} core ATen ops have no lowering: {missing}"
