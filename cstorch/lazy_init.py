"""Lazy initialisation: inside `with backend.device:` tensors are recipes, not data.

On a CSX backend with `cstorch.backends.csx.debug.lazy_initialization` (the default),
factory functions (`torch.empty`, `zeros`, `ones`, `full`, `arange`, `eye`, `rand`,
`randn`, the `_like` and `new_*` forms) called inside the device context return a
`LazyInitTensor`: a torch tensor with a shape and a dtype but no data, holding how its
value is made. In-place ops on it (`nn.init.*`, `uniform_`, `normal_`, `zero_`, `fill_`,
`copy_`, arithmetic, writes through views such as `weight[padding_idx].fill_(0)`) extend
that recipe instead of computing anything, and so do ops that make new tensors from lazy
ones inside the context. `cstorch.compile` builds each value directly on the devices with
its sharding (`LazyInitTensor.device_value`): the recipe runs as one small jitted JAX
program whose ops are the bridge's ATen lowerings, so no host copy is ever made.

Random values come from JAX's PRNG, not torch's CPU generator: each random op takes a
key from one 64-bit number drawn from torch's generator when the op is recorded (the
default generator, or the `generator=` passed to it), so values depend on
`torch.manual_seed` and on the order tensors are created, and a run is reproducible,
but they differ from eager PyTorch's. Torch's CPU stream is a Mersenne Twister consumed
sequentially by each kernel's own sampling code; reproducing it on the device would mean
copying those kernels, and the device wants counter-based keys. Large random tensors are
drawn in blocks of rows, so XLA's working memory stays small; the blocks depend on the
shape only, so the values do not depend on the mesh. Deterministic recipes (zeros, ones,
full, arange, eye, copies, arithmetic) give exactly what eager PyTorch gives.

Reading a lazy tensor before compile (printing, `.sum()` outside the context,
`torch.save`, `cstorch.save`) builds its value with the same program compile would run
and copies it to the host, without keeping it: the value read equals the value compile
places. An op that cannot be recorded (no lowering, data-dependent output) runs on the
host with real values; if it writes into a lazy tensor, that tensor's value is kept on
the host from then on and a warning names the op. Dtypes JAX holds differently (int64,
float64 without x64) and empty tensors are created eagerly on the host, so their values
stay exact and `torch.load` can `set_` into them.

CPU and GPU backends create tensors eagerly inside `backend.device`: their values are
eager PyTorch's, as the reference's CPU and GPU backends give. The context is for
building models: a loop run inside it would keep making recipes.
"""
import threading
import warnings
from collections import OrderedDict
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import wafer
from bridge import LOWERINGS, jax_to_tensor, to_jax_dtype, to_torch_dtype
from bridge.convert import tensor_to_numpy
from bridge.device_tensor import HostReads
from bridge.device_tensor import Absent, DeviceTensor
from bridge.ops.random import key_stream
from cstorch.storage.lazy import LazyTensor

aten = torch.ops.aten
_local = threading.local()

# Functional ops that use only the shape and dtype of their first argument: a recipe
# for them does not depend on the value they overwrite.
_SHAPE_OF_FIRST = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
                   aten.empty_like.default, aten.rand_like.default, aten.randn_like.default,
                   aten.new_zeros.default, aten.new_ones.default, aten.new_full.default,
                   aten.new_empty.default, aten.new_empty_strided.default,
                   aten.fill.Scalar, aten.copy.default, aten.uniform.default,
                   aten.normal_functional.default, aten.bernoulli.p}
_LIKE = {aten.zeros_like, aten.ones_like, aten.full_like, aten.empty_like, aten.rand_like,
         aten.randn_like, aten.new_zeros, aten.new_ones, aten.new_full, aten.new_empty,
         aten.new_empty_strided}
_IN_PLACE = {aten.normal_.default: aten.normal_functional.default,
             aten.zero_.default: aten.zeros_like.default,
             aten.bernoulli_.float: aten.bernoulli.p,
             aten.bernoulli_.Tensor: aten.bernoulli.Tensor}
_IDENTITY = {aten.detach.default, aten.alias.default, aten.lift_fresh.default}
_STATIC = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout,
           torch.memory_format)


# recipes ---------------------------------------------------------------------------
class _Node:
    """One value of a recipe, never its data. Immutable: a write makes a new node.

    kind "const": `value` is a host tensor or a device array the recipe starts from.
    kind "op":    `op` (a functional ATen overload with a lowering) of `args`/`kwargs`,
                  whose tensors are `_Ref`s; `seed` keys a random op; `dtypes` are the
                  torch dtypes of its results (a tuple for a multi-output op).
    kind "write": the value of `args[0]` (a `_Ref`) with the elements that the view
                  chain `args[1]` selects replaced by `args[2]` (a `_Ref`).
    """
    __slots__ = ("kind", "op", "args", "kwargs", "seed", "value", "dtypes", "__weakref__")

    def __init__(self, kind, op=None, args=(), kwargs=None, seed=None, value=None, dtypes=None):
        self.kind, self.op, self.args, self.kwargs = kind, op, args, kwargs or {}
        self.seed, self.value, self.dtypes = seed, value, dtypes

    def deps(self):
        refs = pytree.tree_leaves((self.args, self.kwargs),
                                  is_leaf=lambda x: isinstance(x, _Ref))
        return [r.node for r in refs if isinstance(r, _Ref)]


class _Ref(NamedTuple):
    """A tensor of a recipe: output `index` of `node` (None for its only output) seen
    through `chain`, a tuple of (view op, args, kwargs, output index) steps."""
    node: _Node
    index: object
    chain: tuple
    shape: tuple
    dtype: torch.dtype


class _Storage:
    """What the aliases of one lazy tensor share: `root` is the recipe of the whole value;
    a write through any alias replaces it. `meta` is a meta tensor with the value's shape,
    dtype and strides, whose views give the aliases theirs."""
    __slots__ = ("root", "meta", "backend")

    def __init__(self, root: _Ref, meta, backend):
        self.root, self.meta, self.backend = root, meta, backend


def _native(dtype) -> bool:
    """Whether JAX holds `dtype` as it is (not int64 as int32, float64 as float32)."""
    try:
        return to_torch_dtype(to_jax_dtype(dtype)) == dtype
    except (TypeError, KeyError):
        return False


def _const(value) -> _Ref:
    """A recipe that starts from a tensor's current value (snapshotted)."""
    if isinstance(value, DeviceTensor) and not value.is_view and not isinstance(value.cell.array, Absent):
        data = value.cell.array
    elif isinstance(value, LazyTensor):
        data = value.materialize()
    else:
        if isinstance(value, DeviceTensor):
            value = value.host()
        data = value.detach().clone()
    return _Ref(_Node("const", value=data, dtypes=value.dtype), None, (),
                tuple(value.shape), value.dtype)


# the tensor ------------------------------------------------------------------------
class LazyInitTensor(HostReads, LazyTensor):
    """A tensor created inside `backend.device` with lazy initialisation: its recipe,
    shape and dtype, no data. Built on the devices by `cstorch.compile`; reading it
    before builds it on the host (not kept). Aliases (`.data`, `detach()`, views such as
    `w[0]` or `w.t()`) share one recipe, so writes through any of them are seen by all."""

    __torch_function__ = torch._C._disabled_torch_function_impl
    _handles_ops = True

    @staticmethod
    def __new__(cls, storage, chain, meta):
        return torch.Tensor._make_wrapper_subclass(
            cls, meta.shape, strides=meta.stride(), storage_offset=meta.storage_offset(),
            dtype=meta.dtype, device="cpu", requires_grad=False)

    def __init__(self, storage, chain, meta):
        LazyTensor.__init__(self, tuple(meta.shape), meta.dtype)
        self._storage, self._chain, self._meta = storage, chain, meta

    def _ref(self) -> _Ref:
        root = self._storage.root
        if not self._chain:
            return root
        return _Ref(root.node, root.index, root.chain + self._chain, tuple(self.shape), self.dtype)

    def _alias(self):
        return LazyInitTensor(self._storage, self._chain, self._meta)

    @property
    def is_materialized(self) -> bool:
        """True when the value is held on the host (an op that could not be recorded
        wrote it there); False while it is only a recipe."""
        return self._storage.root.node.kind == "const" and not isinstance(
            self._storage.root.node.value, jax.Array)

    def device_value(self, sharding):
        """The value built on the devices, laid out by `sharding`, without a host copy."""
        return _build(self._ref(), sharding)

    def _host_view(self):
        """The value on the host; may share memory with a device buffer or the recipe's
        constant, so never write to it."""
        storage = self._storage
        root = storage.root
        if root.node.kind == "const" and not root.chain and not isinstance(root.node.value, jax.Array):
            base = root.node.value
        else:
            sharding = wafer.state_sharding(storage.backend.mesh, root.shape)
            base = jax_to_tensor(_build(root, sharding), root.dtype)
        return _apply_chain_host(base, self._chain)

    def materialize(self, keep: bool = False) -> torch.Tensor:
        """The value as an ordinary host tensor, built on each call and never kept (a
        lazily created tensor is meant to stay off the host); `keep` is ignored."""
        return self._host_view().clone()

    # `.data` aliases the same recipe; assigning it rebinds this tensor, as in torch.
    @property
    def data(self):
        return self._alias()

    @data.setter
    def data(self, value):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"can only assign a tensor to .data, got {type(value).__name__}")
        if not isinstance(value, LazyInitTensor):
            value = _lazy_of(_const(value), self._storage.backend)
        # A shape or dtype change (module.to(dtype)) changes this tensor's own metadata.
        _rebind(self, value)

    # host access without the dispatcher: bridge's HostReads reads through host()
    def host(self) -> torch.Tensor:
        return self.materialize()

    def item(self):
        return self._host_view().item()

    def __format__(self, spec):
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __repr__(self, *, tensor_contents=None):
        value = self._host_view()
        text = repr(value.detach().requires_grad_(True) if self.requires_grad else value)
        return f"Parameter containing:\n{text}" if getattr(self, "_is_param", False) else text

    def __deepcopy__(self, memo):
        # Recipes are immutable: a copy shares the recipe, not the aliasing.
        ref = self._ref()
        meta = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")
        out = LazyInitTensor(_Storage(ref, meta, self._storage.backend), (), meta)
        if getattr(self, "_is_param", False):
            out = torch.nn.Parameter(out, self.requires_grad)
        elif self.requires_grad:
            out.requires_grad_(True)
        memo[id(self)] = out
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {}, inside=False)


def is_lazy(tensor) -> bool:
    """Whether `tensor` is a lazily initialised tensor that holds no data on the host."""
    return isinstance(tensor, LazyInitTensor) and not tensor.is_materialized


def _lazy_of(ref: _Ref, backend, meta=None) -> LazyInitTensor:
    if meta is None:
        meta = torch.empty(ref.shape, dtype=ref.dtype, device="meta")
    return LazyInitTensor(_Storage(ref, meta, backend), (), meta)


def _apply_chain_host(base, chain):
    for op, args, kwargs, index in chain:
        base = op(base, *args, **kwargs)
        if index is not None:
            base = base[index]
    return base


# recording -------------------------------------------------------------------------
class _Unrecordable(Exception):
    """This op cannot join a recipe; it runs on the host instead."""


def _written(func, args, kwargs):
    """The arguments `func` writes into (in-place `self`, out=)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = kwargs.get(a.name) if a.kwarg_only or i >= len(args) else args[i]
        out.extend(t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))
    return out


def _bind(func, args, kwargs) -> dict:
    """Every argument of a call by name."""
    bound = dict(kwargs)
    for a, v in zip(func._schema.arguments, args):
        bound[a.name] = v
    return bound


def _counterpart(op, drop):
    """The overload of `op`'s packet that takes the same positional arguments except the
    names in `drop`, and writes no out= argument and takes no generator."""
    want = tuple(a.name for a in op._schema.arguments if not a.kwarg_only and a.name not in drop)
    packet = op.overloadpacket
    for name in packet.overloads():
        cand = getattr(packet, name)
        args = cand._schema.arguments
        if any(a.is_out or a.name == "generator" for a in args) or cand._schema.is_mutable:
            continue
        if tuple(a.name for a in args if not a.kwarg_only) == want:
            return cand
    return None


def _functional(func):
    """The functional overload computing what `func` writes or returns, or None."""
    schema = func._schema
    if func in _IN_PLACE:
        return _IN_PLACE[func]
    if any(a.is_out for a in schema.arguments):
        return _counterpart(func, {a.name for a in schema.arguments if a.is_out})
    if schema.is_mutable:
        packet = getattr(aten, schema.name.split("::")[1].rstrip("_"), None)
        cand = getattr(packet, func._overloadname, None) if packet is not None else None
        return cand if cand is not None and not cand._schema.is_mutable else None
    if any(a.name == "generator" for a in schema.arguments) and func._overloadname != "default" \
            and "generator" in func._overloadname:
        return _counterpart(func, {"generator"})
    return func


def _random(*ops) -> bool:
    """Whether an op draws random numbers: some overload of its family takes a generator
    (`randn.default` takes none, `randn.generator` does)."""
    for op in ops:
        packet = op.overloadpacket
        for name in packet.overloads():
            if any(a.name == "generator" for a in getattr(packet, name)._schema.arguments):
                return True
    return False


def _draw_seed(generator) -> int:
    """One 64-bit number from torch's generator: the key of one random op, so values
    follow `torch.manual_seed` and the order of creation."""
    g = generator if isinstance(generator, torch.Generator) and generator.device.type == "cpu" else None
    return int(torch.randint(0, 2 ** 62, (1,), generator=g, dtype=torch.int64)[0])


def _meta_of(t):
    if isinstance(t, LazyInitTensor):
        return t._meta
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


def _meta_call(func, args, kwargs):
    """Run `func` on meta tensors: shapes, dtypes, strides and torch's own argument checks,
    without data."""
    def meta(x):
        if isinstance(x, torch.Tensor):
            return _meta_of(x)
        return x
    margs, mkwargs = pytree.tree_map(meta, (args, kwargs))
    if "device" in mkwargs:
        device = mkwargs["device"]
        if device is not None and torch.device(device).type != "cpu":
            raise _Unrecordable(f"device {device}")
        mkwargs["device"] = torch.device("meta")
    elif not any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves((args, kwargs))):
        if any(a.name == "device" for a in func._schema.arguments):
            mkwargs["device"] = torch.device("meta")
    try:
        return func(*margs, **mkwargs)
    except Exception as e:
        raise _Unrecordable(f"{type(e).__name__}: {e}") from e


def _to_recipe(x):
    """An argument as a recipe holds it: tensors as `_Ref`s, generators dropped (their
    number was drawn), anything that is not a static value refused."""
    if isinstance(x, LazyInitTensor):
        return x._ref()
    if isinstance(x, torch.Tensor):
        if not _native(x.dtype) and x.dtype not in (torch.int64, torch.float64):
            raise _Unrecordable(f"a {x.dtype} tensor argument")
        return _const(x)
    if isinstance(x, torch.Generator):
        return None
    if isinstance(x, (list, tuple)):
        return type(x)(_to_recipe(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_recipe(v) for k, v in x.items()}
    if isinstance(x, torch.Size):
        return tuple(x)
    if isinstance(x, _STATIC):
        return x
    raise _Unrecordable(f"an argument of type {type(x).__name__}")


def _record(func, args, kwargs, written, backend):
    """The result of `func` on lazy tensors, as recipes; raises `_Unrecordable`."""
    functional = _functional(func)
    if functional is None or functional not in LOWERINGS:
        raise _Unrecordable("no lowering")
    meta_out = _meta_call(func, args, kwargs)
    outs = meta_out if isinstance(meta_out, (list, tuple)) else [meta_out]
    if not all(isinstance(o, torch.Tensor) for o in outs) or not outs:
        raise _Unrecordable("a result that is not a tensor")
    if not all(_native(o.dtype) for o in outs):
        raise _Unrecordable(f"a {outs[0].dtype} result")
    if not written and not any(isinstance(x, LazyInitTensor) for x in pytree.tree_leaves((args, kwargs))) \
            and any(o.numel() == 0 for o in outs):
        # An empty tensor costs nothing on the host, and torch.load makes one to set_ data into.
        raise _Unrecordable("an empty result")
    bound = _bind(func, args, kwargs)
    seed = _draw_seed(bound.get("generator")) if _random(func, functional) else None
    schema = functional._schema
    fargs, fkwargs = [], {}
    for i, a in enumerate(schema.arguments):
        if a.name not in bound or a.name == "generator":
            continue
        value = bound[a.name]
        if i == 0 and functional in _SHAPE_OF_FIRST and isinstance(value, torch.Tensor):
            value = jax.ShapeDtypeStruct(tuple(value.shape), to_jax_dtype(value.dtype))
        else:
            value = _to_recipe(value)
        if a.kwarg_only:
            fkwargs[a.name] = value
        else:
            fargs.append(value)
    if "device" in fkwargs:
        fkwargs["device"] = None
    if written:
        target = written[0]
        node = _Node("op", functional, tuple(fargs), fkwargs, seed, dtypes=target.dtype)
        if tuple(_meta_of(target).shape) != tuple(target.shape):
            raise RuntimeError(
                f"{func} would resize a lazily initialised tensor from {tuple(target.shape)}; "
                "create it with its final shape inside backend.device, or build the model "
                "with cstorch.backends.csx.debug.lazy_initialization = False")
        _assign(target, _Ref(node, None, (), tuple(target.shape), target.dtype))
        return args[0] if not any(a.is_out for a in func._schema.arguments) else target
    multi = isinstance(meta_out, (list, tuple))
    node = _Node("op", functional, tuple(fargs), fkwargs, seed,
                 dtypes=tuple(o.dtype for o in outs) if multi else outs[0].dtype)
    results = [_lazy_of(_Ref(node, i if multi else None, (), tuple(o.shape), o.dtype), backend,
                        torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device="meta"))
               for i, o in enumerate(outs)]
    return type(meta_out)(results) if multi else results[0]


def _assign(target: LazyInitTensor, value: _Ref):
    """Make `value` the value of `target`, and so of the part of its storage it views."""
    storage = target._storage
    if not target._chain and value.shape == storage.root.shape:
        storage.root = _Ref(value.node, value.index, value.chain, value.shape, storage.root.dtype)
        return
    node = _Node("write", args=(storage.root, target._chain, value), dtypes=storage.root.dtype)
    storage.root = _Ref(node, None, (), storage.root.shape, storage.root.dtype)


def _record_view(func, args, kwargs):
    """A view of a lazy tensor: an alias that shares its storage and remembers the view."""
    src = args[0]
    if func not in LOWERINGS:
        raise RuntimeError(
            f"{func} cannot view a lazily initialised tensor (there is no lowering to replay "
            "it on the device); call it after cstorch.compile, or build the model with "
            "cstorch.backends.csx.debug.lazy_initialization = False")
    meta_out = _meta_call(func, args, kwargs)
    try:
        rest = _to_recipe(tuple(args[1:])), _to_recipe(dict(kwargs))
    except _Unrecordable as e:
        raise RuntimeError(f"{func} cannot view a lazily initialised tensor: it takes {e}") from None
    if any(isinstance(x, _Ref) for x in pytree.tree_leaves(rest, is_leaf=lambda x: isinstance(x, _Ref))):
        raise RuntimeError(f"{func} cannot view a lazily initialised tensor by a tensor argument")
    if isinstance(meta_out, (list, tuple)):
        return type(meta_out)(
            LazyInitTensor(src._storage, src._chain + ((func, rest[0], rest[1], i),), m)
            for i, m in enumerate(meta_out))
    return LazyInitTensor(src._storage, src._chain + ((func, rest[0], rest[1], None),), meta_out)


def _factory(func, args, kwargs) -> bool:
    """Whether `func` makes a new tensor from no data (a factory, or a `_like`/`new_*` op
    of a host tensor), the way a lazy tensor is made."""
    if func.overloadpacket in _LIKE:
        return True
    if func._schema.is_mutable or func.is_view:
        return False
    if any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves((args, kwargs))):
        return False
    returns = func._schema.returns
    return len(returns) == 1 and str(returns[0].type) == "Tensor"


_warned = set()


def _warn_host(func, why):
    name = str(func)
    if name in _warned:
        return
    _warned.add(name)
    warnings.warn(
        f"{name} on a lazily initialised tensor could not be recorded ({why}); it ran on "
        "the host, and the tensor it wrote keeps its value on the host until "
        "cstorch.compile uploads it", stacklevel=4)


def _eager(func, args, kwargs, written, why):
    """Run `func` on host values. Lazy tensors it writes into get the result as their
    value (kept on the host); lazy tensors it reads are built for it, or, for ops that
    only look at shapes, stand in as empty tensors."""
    if func.is_view and isinstance(args[0], LazyInitTensor):
        raise RuntimeError(
            f"{func} cannot view a lazily initialised tensor ({why}); call it after "
            "cstorch.compile, or build the model with "
            "cstorch.backends.csx.debug.lazy_initialization = False")
    bases = {}
    for t in written:
        if id(t._storage) not in bases:
            bases[id(t._storage)] = (t._storage, _alias_root(t)._host_view().clone())
    originals = {}

    def to_host(t):
        if any(t is w for w in written):
            host = _apply_chain_host(bases[id(t._storage)][1], t._chain)
            originals[id(host)] = t
            return host
        if func.overloadpacket in _LIKE:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
        return t._host_view()

    host_args, host_kwargs = pytree.tree_map_only(LazyInitTensor, to_host, (args, kwargs))
    out = func(*host_args, **host_kwargs)
    for storage, base in bases.values():
        storage.root = _Ref(_Node("const", value=base, dtypes=base.dtype), None, (),
                            tuple(base.shape), base.dtype)
    if bases:
        _warn_host(func, why)
    # An in-place or out= op returns the tensor it wrote: give back the lazy one.
    return pytree.tree_map_only(torch.Tensor, lambda o: originals.get(id(o), o), out)


def _alias_root(t):
    return LazyInitTensor(t._storage, (), t._storage.meta)


def _dispatch(func, args, kwargs, inside, backend=None):
    """One ATen call that may involve lazy tensors; `inside`: within `backend.device`."""
    if func is aten._has_compatible_shallow_copy_type.default:
        # Compares tensor kinds only (`.data =` asks it): no value involved.
        with torch._C._DisableTorchDispatch():
            return func(*args, **kwargs)
    if getattr(_local, "busy", False):
        return func(*args, **kwargs)
    _local.busy = True
    try:
        return _handle(func, args, kwargs, inside, backend)
    finally:
        _local.busy = False


def _handle(func, args, kwargs, inside, backend):
    leaves = pytree.tree_leaves((args, kwargs))
    lazies = [x for x in leaves if isinstance(x, LazyInitTensor)]
    if not lazies:
        if inside and _factory(func, args, kwargs) and not _traced(leaves):
            try:
                out = _record(func, args, kwargs, [], backend)
            except _Unrecordable:
                return func(*args, **kwargs)
            return out
        return func(*args, **kwargs)
    if func in _IDENTITY:
        return args[0]._alias()
    if func.overloadpacket in (aten.set_, aten.resize_, aten.resize_as_):
        raise RuntimeError(
            f"{func} cannot rebind or resize a lazily initialised tensor; create it with "
            "its final shape inside backend.device, or set "
            "cstorch.backends.csx.debug.lazy_initialization = False")
    backend = backend if backend is not None else lazies[0]._storage.backend
    written = _written(func, args, kwargs)
    lazy_written = [t for t in written if isinstance(t, LazyInitTensor)]
    if func.is_view and not written:
        return _record_view(func, args, kwargs)
    if _in_place_view(func) and isinstance(args[0], LazyInitTensor):
        # t_(), squeeze_(), ...: the tensor itself becomes a view of what it was.
        view = _record_view(_functional(func), args, kwargs)
        _rebind(args[0], view)
        return args[0]
    if func is aten.copy_.default and isinstance(args[0], LazyInitTensor) \
            and not isinstance(args[1], LazyInitTensor) and args[1].shape == args[0].shape \
            and args[1].dtype == args[0].dtype and _native(args[1].dtype):
        # A host value copied in (load_state_dict): the recipe is that value, held on the host.
        _assign(args[0], _const(args[1]))
        return args[0]
    why = "outside backend.device only writes are recorded"
    if lazy_written and len(written) == 1 or (inside and not written):
        try:
            return _record(func, args, kwargs, lazy_written, backend)
        except _Unrecordable as e:
            why = str(e)
    elif written:
        why = "it writes into tensors that are not lazy" if not lazy_written \
            else "it writes into several tensors"
    return _eager(func, args, kwargs, lazy_written, why)


def _in_place_view(func) -> bool:
    if not func._schema.is_mutable or not func._schema.name.endswith("_"):
        return False
    functional = _functional(func)
    return functional is not None and functional.is_view


def _rebind(t: LazyInitTensor, value: LazyInitTensor):
    """Make `t` stand for `value` (its storage, view and metadata), as `.data =` does."""
    if tuple(value.shape) != tuple(t.shape) or value.dtype != t.dtype or value.stride() != t.stride():
        with torch.no_grad():
            torch._C.TensorBase.data.__set__(t, LazyInitTensor(value._storage, value._chain, value._meta))
    t._storage, t._chain, t._meta = value._storage, value._chain, value._meta


def _traced(leaves) -> bool:
    """Whether a tracer's tensors take part: capture must see real factories."""
    from torch._subclasses.fake_tensor import FakeTensor
    return any(isinstance(x, FakeTensor) for x in leaves) or \
        torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


class _LazyMode(TorchDispatchMode):
    """Active inside `backend.device` with lazy initialisation: factories make recipes."""

    def __init__(self, backend):
        super().__init__()
        self.backend = backend

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {}, inside=True, backend=self.backend)


# building --------------------------------------------------------------------------
class _Slot(NamedTuple):
    """A recipe tensor in a program: output `index` of value `pos`, through `chain`."""
    pos: int
    index: object
    chain: tuple


def _linearize(root: _Ref):
    """The nodes `root` depends on, in an order where each follows its inputs."""
    order, seen, stack = [], set(), [(root.node, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((d, False) for d in reversed(node.deps()) if id(d) not in seen)
    return order


def _freeze(x):
    """A hashable key for a program argument; equal keys mean the same program."""
    if isinstance(x, _Slot):
        return ("slot", x.pos, _freeze(x.index), _freeze(x.chain))
    if isinstance(x, list):
        return ("list",) + tuple(_freeze(v) for v in x)
    if isinstance(x, tuple):
        return ("tuple",) + tuple(_freeze(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, jax.ShapeDtypeStruct):
        return ("shape", tuple(x.shape), str(x.dtype))
    if isinstance(x, (bool, int, float, complex)):
        return (type(x).__name__, repr(x))
    return x


def _program(root: _Ref):
    """(steps, key, consts, seeds): the recipe of `root` as a list of steps that refer to
    earlier steps by position; constants and seeds are the program's inputs."""
    order = _linearize(root)
    pos = {id(n): i for i, n in enumerate(order)}
    consts, seeds = [], []

    def slot(x):
        if isinstance(x, _Ref):
            return _Slot(pos[id(x.node)], x.index, x.chain)
        return x

    steps = []
    for node in order:
        if node.kind == "const":
            steps.append(("const", len(consts), node.dtypes))
            consts.append(node.value)
        elif node.kind == "op":
            args, kwargs = pytree.tree_map(slot, (node.args, node.kwargs),
                                           is_leaf=lambda x: isinstance(x, _Ref))
            seed = None
            if node.seed is not None:
                seed = len(seeds)
                seeds.append(node.seed)
            steps.append(("op", node.op, args, kwargs, seed, node.dtypes))
        else:
            base, chain, value = node.args
            steps.append(("write", slot(base), chain, slot(value), node.dtypes))
    const_key = tuple((tuple(c.shape), str(c.dtype)) for c in consts)
    key = (_freeze(steps), _freeze(slot(root)), root.dtype, const_key)
    return steps, key, consts, seeds


def _chain(value, chain):
    for op, args, kwargs, index in chain:
        value = LOWERINGS[op](value, *args, **kwargs)
        if index is not None:
            value = value[index]
    return value


def _cast(value, dtype):
    want = to_jax_dtype(dtype)
    return value if value.dtype == want else value.astype(want)


def _run(steps, root, consts, seeds):
    values = []

    def get(s):
        if isinstance(s, _Slot):
            v = values[s.pos]
            return _chain(v if s.index is None else v[s.index], s.chain)
        return s

    for step in steps:
        kind = step[0]
        if kind == "const":
            values.append(consts[step[1]])
        elif kind == "op":
            _, op, args, kwargs, seed, dtypes = step
            args, kwargs = pytree.tree_map(get, (args, kwargs), is_leaf=lambda x: isinstance(x, _Slot))
            if seed is None:
                out = LOWERINGS[op](*args, **kwargs)
            else:
                key = jax.random.fold_in(jax.random.key(seeds[seed, 0]), seeds[seed, 1])
                out = _draw(op, args, kwargs, key, dtypes)
            if isinstance(dtypes, tuple):
                out = tuple(_cast(o, d) for o, d in zip(out, dtypes))
            else:
                out = _cast(out, dtypes)
            values.append(out)
        else:
            _, base, chain, value, dtype = step
            values.append(_write(get(base), chain, get(value)))
    return _cast(get(root[0]), root[1])


# Where a random op's arguments give its shape: the first argument's shape, or a size.
_SHAPE_ARG = {aten.uniform.default: 0, aten.normal_functional.default: 0, aten.bernoulli.p: 0,
              aten.rand_like.default: 0, aten.randn_like.default: 0, aten.rand.default: "size",
              aten.randn.default: "size", aten.randint.low: "size", aten.randint.default: "size",
              aten.normal.float_float: "size"}
# A large random tensor is drawn this many elements at a time: JAX's threefry on the CPU
# keeps temporaries of three times what one draw makes (768 MiB for a 256 MiB weight).
_DRAW_ELEMENTS = 1 << 22


def _draw(op, args, kwargs, key, dtypes):
    """A random op's result. A large one is drawn in blocks of leading rows, each from
    its own key folded from `key`, in one loop: XLA's temporaries stay the size of a
    block. The blocks depend only on the shape, so the values do not depend on the
    mesh."""
    where = _SHAPE_ARG.get(op)
    if where is None or isinstance(dtypes, tuple):
        with key_stream(key):
            return LOWERINGS[op](*args, **kwargs)
    names = [a.name for a in op._schema.arguments]
    i = names.index("size") if where == "size" else where
    bound = list(args) + [kwargs.pop(n) for n in names[len(args):i + 1] if n in kwargs]
    shape = tuple(bound[i]) if where == "size" else tuple(bound[i].shape)
    numel = int(np.prod(shape)) if shape else 1
    if numel <= _DRAW_ELEMENTS or not shape:
        with key_stream(key):
            return LOWERINGS[op](*bound, **kwargs)
    per_row = numel // shape[0]
    target = max(1, _DRAW_ELEMENTS // max(per_row, 1))
    rows = _divisor_at_most(shape[0], target)
    block = (rows,) + shape[1:]
    if where == "size":
        bound[i] = list(block)
    else:
        bound[i] = jax.ShapeDtypeStruct(block, bound[i].dtype)
    dtype = to_jax_dtype(dtypes)

    def body(j, out):
        with key_stream(jax.random.fold_in(key, j)):
            part = LOWERINGS[op](*bound, **kwargs)
        return jax.lax.dynamic_update_slice(out, part.astype(dtype), (j * rows,) + (0,) * (len(shape) - 1))
    return jax.lax.fori_loop(0, shape[0] // rows, body, jnp.zeros(shape, dtype))


def _divisor_at_most(n, limit):
    best, d = 1, 1
    while d * d <= n:
        if n % d == 0:
            for c in (d, n // d):
                if best < c <= limit:
                    best = c
        d += 1
    return best


def _write(base, chain, value):
    """`base` with the elements the view `chain` selects set to `value`."""
    if base.ndim == 0:
        index = _chain(jnp.zeros((), jnp.int32), chain)
        flat = base.reshape(1).at[index].set(jnp.broadcast_to(value, index.shape).astype(base.dtype))
        return flat.reshape(())
    coords = tuple(_chain(jax.lax.broadcasted_iota(jnp.int32, base.shape, d), chain)
                   for d in range(base.ndim))
    return base.at[coords].set(jnp.broadcast_to(value, coords[0].shape).astype(base.dtype))


_programs: "OrderedDict[tuple, object]" = OrderedDict()
_MAX_PROGRAMS = 256


def _const_input(value, sharding):
    if isinstance(value, jax.Array):
        if value.sharding.device_set == sharding.device_set:
            return value
        value = jax_to_tensor(value)  # another backend's devices: through the host
    if not _native(value.dtype):
        value = value.to(to_torch_dtype(to_jax_dtype(value.dtype)))
    return tensor_to_numpy(value)


def _build(root: _Ref, sharding):
    """The value of `root` computed on the devices of `sharding`, laid out by it."""
    steps, key, consts, seeds = _program(root)
    key = (key, sharding)
    fn = _programs.get(key)
    if fn is None:
        rootslot = (_Slot(len(steps) - 1, root.index, root.chain), root.dtype)
        fn = jax.jit(partial(_run, steps, rootslot), out_shardings=sharding)
        _programs[key] = fn
        if len(_programs) > _MAX_PROGRAMS:
            _programs.popitem(last=False)
    else:
        _programs.move_to_end(key)
    seed_words = np.array([[(s >> 32) & 0xFFFFFFFF, s & 0xFFFFFFFF] for s in seeds],
                          dtype=np.uint32).reshape(len(seeds), 2)
    return fn(tuple(_const_input(c, sharding) for c in consts), seed_words)


# the device context ----------------------------------------------------------------
class Device:
    """`backend.device`: the backend's device, printable ("CSX", "CPU", "GPU") and a
    context manager to build a model in.

    On a CSX backend with `cstorch.backends.csx.debug.lazy_initialization` (default True,
    read when the context is entered), tensors created inside it are lazy
    (`LazyInitTensor`): no host memory, built on the devices by `cstorch.compile`. On CPU
    and GPU backends, or with the flag False, tensors are created eagerly by PyTorch, with
    eager PyTorch's values. Entering it again while inside is allowed and changes nothing.
    """

    def __init__(self, backend):
        self._backend = backend
        self._mode = None
        self._depth = 0

    @property
    def type(self) -> str:
        return str(self._backend.backend_type)

    @property
    def lazy_initialization(self) -> bool:
        """Whether entering this context now makes created tensors lazy."""
        from cstorch.backends import csx
        return self._backend.is_csx and csx.debug.lazy_initialization

    def __str__(self):
        return self.type

    def __repr__(self):
        return f"device(type={self.type!r})"

    def __enter__(self):
        if self._depth == 0 and self.lazy_initialization:
            self._mode = _LazyMode(self._backend)
            self._mode.__enter__()
        self._depth += 1
        return self

    def __exit__(self, *exc):
        self._depth -= 1
        if self._depth == 0 and self._mode is not None:
            mode, self._mode = self._mode, None
            mode.__exit__(*exc)
        return False
