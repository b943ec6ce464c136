"""Ops that check or read a value rather than compute one: they lower to nothing, or
to the value itself, since a compiled step cannot stop to look at data."""
import torch

from bridge.ops.registry import lowering

aten = torch.ops.aten


@lowering(aten._local_scalar_dense.default)
def local_scalar_dense(x):
    # Under jit this is a traced scalar; graphs only keep it where its value feeds tensors.
    return x.reshape(())


@lowering(aten._linalg_check_errors.default)
def linalg_check_errors(info, api_name, is_matrix):
    # XLA's factorizations report no errors (info is always 0), so there is nothing to check.
    return None


@lowering(aten._assert_tensor_metadata.default)
def assert_tensor_metadata(*args, **kwargs):
    # export's dtype/shape guards: shapes and dtypes are static once lowered, so they hold.
    return None
