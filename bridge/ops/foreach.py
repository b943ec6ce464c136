"""`aten._foreach_*`: one op over a list of tensors, lowered as the per-tensor op's lowering
applied to each element.

A grouped optimizer update (`torch.optim` with ``foreach=True``, cstorch's grouped rules)
is then a few graph nodes instead of a few per parameter, which makes capture and lowering
proportionally faster, while the JAX program holds the same per-tensor operations, with
the same rounding, as the per-parameter form would.

Each functional overload maps to one per-tensor overload. Arguments typed ``Tensor[]`` or
``Scalar[]`` give element i to call i; other arguments (a scalar, one 0-d tensor,
``alpha``) go to every call. Ops whose per-tensor op has no lowering get none.
"""
import torch

from bridge.ops.registry import LOWERINGS, lowering

aten = torch.ops.aten

# The per-tensor overload of each foreach overload, by the foreach overload's name.
_BINARY = {"Scalar": "Tensor", "List": "Tensor", "ScalarList": "Tensor", "Tensor": "Tensor"}
_CLAMP = {"Scalar": "default", "List": "Tensor", "ScalarList": "default"}
_PER_TENSOR = {
    **{name: _BINARY for name in ("add", "sub", "mul", "div")},
    "clamp_min": _CLAMP, "clamp_max": _CLAMP,
    "maximum": {"List": "default"}, "minimum": {"List": "default"},
    "pow": {"List": "Tensor_Tensor", "Scalar": "Tensor_Scalar", "ScalarList": "Tensor_Scalar",
            "ScalarAndTensor": "Scalar"},
    # (not the "Tensor" overloads: their `scalars` are host values, which a trace has not)
    "addcmul": {"Scalar": "default", "ScalarList": "default"},
    "addcdiv": {"Scalar": "default", "ScalarList": "default"},
    "lerp": {"List": "Tensor", "Scalar": "Scalar", "ScalarList": "Scalar"},
    "copy": {"default": "default"},
    "clone": {"default": "default"},
    "mm": {"default": "default"},
    "max": {"default": "default"},
    "norm": {"Scalar": "linalg_vector_norm.default"},
}
_UNARY = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1",
          "floor", "frac", "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal",
          "round", "rsqrt", "sigmoid", "sign", "sin", "sinh", "sqrt", "tan", "tanh", "trunc")
_PER_TENSOR.update({name: {"default": "default"} for name in _UNARY})
# Positional arguments of a foreach op that the per-tensor op takes at another position.
_BY_NAME = {"norm": ("dtype",)}


def _per_element(foreach_op, per_tensor_op, by_name=()):
    schema = foreach_op._schema
    positional = [a for a in schema.arguments if not a.kwarg_only and a.name not in by_name]
    listed = [str(a.type) in ("List[Tensor]", "List[number]") for a in positional]
    per_tensor = LOWERINGS[per_tensor_op]

    def lower(*args, **kwargs):
        given = list(args[:len(positional)])
        kwargs.update(zip(by_name, args[len(positional):]))
        for a in positional[len(given):]:
            given.append(kwargs.pop(a.name) if a.name in kwargs else a.default_value)
        args = given
        # What is left in kwargs is keyword-only (alpha, memory_format) or in `by_name`.
        count = len(next(a for a, is_list in zip(args, listed) if is_list))
        return [per_tensor(*(a[i] if is_list else a for a, is_list in zip(args, listed)),
                           **kwargs)
                for i in range(count)]
    return lower


def _register():
    for name, overloads in _PER_TENSOR.items():
        packet = getattr(aten, f"_foreach_{name}", None)
        if packet is None:
            continue
        for overload, target in overloads.items():
            foreach_op = getattr(packet, overload, None)
            base, _, target_overload = target.rpartition(".")
            per_tensor_op = getattr(getattr(aten, base or name), target_overload, None)
            if foreach_op is None or per_tensor_op not in LOWERINGS:
                continue
            lowering(foreach_op)(_per_element(foreach_op, per_tensor_op, _BY_NAME.get(name, ())))


_register()
