"""`cstorch.make_constant`."""
import torch

__all__ = ["make_constant"]


def make_constant(value) -> torch.Tensor:
    """`value` as a constant of the step: the same values, cut from autograd (no gradient
    flows through it). A tensor, or anything `torch.as_tensor` takes.

    On a Cerebras system this tells the compiler to fold the computation of `value` into
    a constant. XLA folds every computation that depends on no step input by itself, so
    here nothing else is needed: a tensor made from Python values or host tensors inside
    a traced step is already a constant of the compiled program.
    """
    if not isinstance(value, torch.Tensor):
        return torch.as_tensor(value)
    return value.detach()
