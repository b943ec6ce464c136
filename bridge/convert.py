"""The one place where torch tensors and JAX arrays cross over, both ways.

JAX runs with 64-bit types off by default, so int64 and float64 tensors live on the
device as int32 and float32; values cross back to torch in the tensor's own dtype.
CPU values cross without a copy through dlpack where the dtypes agree.
"""
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

_TORCH_TO_NUMPY = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.uint16: np.uint16,
    torch.uint32: np.uint32,
    torch.uint64: np.uint64,
    torch.bool: np.bool_,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}
_NUMPY_TO_TORCH = {np.dtype(v): k for k, v in _TORCH_TO_NUMPY.items()}


# Dtypes whose host tensors a program takes as they are (same dtype on the device).
_INPUT_AS_IS = {torch.float32, torch.int32, torch.bool, torch.uint8, torch.int8, torch.int16,
                torch.float16}


def to_jax_dtype(dtype: torch.dtype):
    """The dtype a JAX array holding a tensor of `dtype` has (canonicalised for x64 mode)."""
    try:
        return _jax_dtype(dtype, jax.config.jax_enable_x64)
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no JAX equivalent") from None


@functools.cache
def _jax_dtype(dtype, x64):
    return jax.dtypes.canonicalize_dtype(_TORCH_TO_NUMPY[dtype])


def to_torch_dtype(dtype) -> torch.dtype:
    return _NUMPY_TO_TORCH[np.dtype(dtype)]


class DeviceBacked:
    """A tensor whose value lives in a device array (`bridge.device_tensor.DeviceTensor`),
    as the conversions here see it: `host()` copies its value to the host, `cell.array`
    is its array unless `is_view`. A base class here, so that this module, which the
    device tensor builds on, need not import it."""
    __slots__ = ()


def tensor_to_numpy(t: torch.Tensor) -> np.ndarray:
    """The values of `t` as a host numpy array of `t`'s own dtype (bfloat16 as
    `ml_dtypes.bfloat16`). May share memory with `t`; a device tensor is copied to the host."""
    if isinstance(t, DeviceBacked):
        t = t.host()
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    try:
        return t.numpy()
    except TypeError:
        raise TypeError(f"torch dtype {t.dtype} has no numpy equivalent") from None


def numpy_to_tensor(a, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A torch CPU tensor with the values of a numpy (or array-like) `a`, in `dtype` if
    given (int64 for a label array computed as int32, say). Shares `a`'s memory when it
    is a writable array and no dtype change is asked for."""
    host = np.asarray(a)
    # torch cannot share a read-only buffer; a writable one is shared, bfloat16 included.
    if not host.flags.writeable:
        host = host.copy()
    if host.dtype == ml_dtypes.bfloat16:
        t = torch.from_numpy(host.view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(host)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t


def _private_jax_numpy(t: torch.Tensor) -> np.ndarray:
    """`t` on the host in the dtype JAX computes `t`'s dtype in, in memory of its own.

    XLA on the CPU may keep using host memory it is handed (`device_put`, even with
    may_alias=False when the memory belongs to a torch tensor, and a program's host
    arguments, read after the call has returned): sharing `t`'s memory, a JAX array would
    follow later writes to `t`, and a donated buffer could write into `t`."""
    host = tensor_to_numpy(t)
    want = to_jax_dtype(t.dtype)
    return host.copy() if host.dtype == want else host.astype(want)


def tensor_to_jax(t: torch.Tensor, sharding=None) -> jax.Array:
    """`t` as a JAX array (laid out by `sharding` when given). A device tensor gives its
    own array; a host tensor is copied to the device."""
    if isinstance(t, DeviceBacked) and not t.is_view:
        a = t.cell.array
        return a if sharding is None or a.sharding == sharding else jax.device_put(a, sharding)
    host = _private_jax_numpy(t)
    if sharding is None:
        return jnp.asarray(host)
    if not sharding.is_fully_addressable:
        return put_global(host, sharding)
    return jax.device_put(host, sharding)


def tensors_to_jax(tensors: Sequence[torch.Tensor], shardings: Sequence) -> list:
    """`tensor_to_jax` of each tensor with its sharding; the host values that go to
    devices of this process go in one transfer."""
    arrays, hosts, where = [None] * len(tensors), [], []
    for i, (t, sharding) in enumerate(zip(tensors, shardings)):
        if (isinstance(t, DeviceBacked) and not t.is_view) or sharding is None \
                or not sharding.is_fully_addressable:
            arrays[i] = tensor_to_jax(t, sharding)
        else:
            hosts.append(_private_jax_numpy(t))
            where.append(i)
    if hosts:
        for i, array in zip(where, jax.device_put(hosts, [shardings[i] for i in where])):
            arrays[i] = array
    return arrays


def tensor_to_input(t: torch.Tensor):
    """What a compiled program takes for `t`: its array if `t` lives on the device, else a
    host numpy array of the program's own (`_private_jax_numpy`), which the executable
    reads in place."""
    if type(t) is torch.Tensor and not t.requires_grad:
        if t.dtype in _INPUT_AS_IS:
            return t.numpy().copy()
        if t.dtype is torch.int64 and not jax.config.jax_enable_x64:
            return t.numpy().astype(np.int32)
    if isinstance(t, DeviceBacked) and not t.is_view:
        return t.cell.array
    return _private_jax_numpy(t)


def jax_to_tensor(a, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A torch CPU tensor with the value of the JAX array (or numpy array) `a`, in `dtype`
    when given. A single-device CPU array crosses through dlpack without a copy: the result
    must then not be written to."""
    if isinstance(a, jax.Array) and a.dtype != ml_dtypes.bfloat16 and _on_one_cpu(a):
        t = torch.from_dlpack(a)
        return t if dtype is None or t.dtype == dtype else t.to(dtype)
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
        return numpy_to_tensor(local_value(a), dtype)
    return numpy_to_tensor(np.asarray(a), dtype)


def put_global(host: np.ndarray, sharding) -> jax.Array:
    """An array laid out by a sharding that spans several processes (a multi-controller
    run), built from this process's `host` value: each process fills only the shards its
    own devices hold. Every process must pass the same value."""
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def local_value(a: jax.Array) -> np.ndarray:
    """The whole value of an array that spans several processes, from the shards this
    process holds. Arrays that are replicated across processes (state, the results of a
    step) are whole on every process; one split across processes is refused, as reading
    it would need every process to take part."""
    out = np.empty(a.shape, a.dtype)
    covered = np.zeros(a.shape, bool)
    for shard in a.addressable_shards:
        out[shard.index] = np.asarray(shard.data)
        covered[shard.index] = True
    if not covered.all():
        raise RuntimeError(
            f"an array of shape {tuple(a.shape)} is split across processes and this process "
            f"holds only part of it, so it cannot be read here; return it from the step "
            f"(results are replicated on every process) to read it")
    return out


def _on_one_cpu(a) -> bool:
    try:
        devices = a.devices()
    except Exception:  # a deleted or donated array
        return False
    return len(devices) == 1 and next(iter(devices)).platform == "cpu" and a.is_fully_addressable
