"""The lazy tensor, and the recording of torch ops on lazy tensors into recipes."""
import threading
import warnings

import jax
import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

import wafer
from bridge import LOWERINGS, jax_to_tensor, to_jax_dtype
from bridge.device_tensor import HostReads
from cstorch.lazy_init.building import build
from cstorch.lazy_init.recipe import Node, Ref, Storage, const_recipe, native
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

    def _ref(self) -> Ref:
        root = self._storage.root
        if not self._chain:
            return root
        return Ref(root.node, root.index, root.chain + self._chain, tuple(self.shape), self.dtype)

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
        return build(self._ref(), sharding)

    def _host_view(self):
        """The value on the host; may share memory with a device buffer or the recipe's
        constant, so never write to it."""
        storage = self._storage
        root = storage.root
        if root.node.kind == "const" and not root.chain and not isinstance(root.node.value, jax.Array):
            base = root.node.value
        else:
            sharding = wafer.state_sharding(storage.backend.mesh, root.shape)
            base = jax_to_tensor(build(root, sharding), root.dtype)
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
            value = lazy_of(const_recipe(value), self._storage.backend)
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
        out = LazyInitTensor(Storage(ref, meta, self._storage.backend), (), meta)
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


def lazy_of(ref: Ref, backend, meta=None) -> LazyInitTensor:
    if meta is None:
        meta = torch.empty(ref.shape, dtype=ref.dtype, device="meta")
    return LazyInitTensor(Storage(ref, meta, backend), (), meta)


def _apply_chain_host(base, chain):
    for op, args, kwargs, index in chain:
        base = op(base, *args, **kwargs)
        if index is not None:
            base = base[index]
    return base


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
    """An argument as a recipe holds it: tensors as `Ref`s, generators dropped (their
    number was drawn), anything that is not a static value refused."""
    if isinstance(x, LazyInitTensor):
        return x._ref()
    if isinstance(x, torch.Tensor):
        if not native(x.dtype) and x.dtype not in (torch.int64, torch.float64):
            raise _Unrecordable(f"a {x.dtype} tensor argument")
        return const_recipe(x)
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
    if not all(native(o.dtype) for o in outs):
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
        node = Node("op", functional, tuple(fargs), fkwargs, seed, dtypes=target.dtype)
        if tuple(_meta_of(target).shape) != tuple(target.shape):
            raise RuntimeError(
                f"{func} would resize a lazily initialised tensor from {tuple(target.shape)}; "
                "create it with its final shape inside backend.device, or build the model "
                "with cstorch.backends.csx.debug.lazy_initialization = False")
        _assign(target, Ref(node, None, (), tuple(target.shape), target.dtype))
        return args[0] if not any(a.is_out for a in func._schema.arguments) else target
    multi = isinstance(meta_out, (list, tuple))
    node = Node("op", functional, tuple(fargs), fkwargs, seed,
                 dtypes=tuple(o.dtype for o in outs) if multi else outs[0].dtype)
    results = [lazy_of(Ref(node, i if multi else None, (), tuple(o.shape), o.dtype), backend,
                        torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device="meta"))
               for i, o in enumerate(outs)]
    return type(meta_out)(results) if multi else results[0]


def _assign(target: LazyInitTensor, value: Ref):
    """Make `value` the value of `target`, and so of the part of its storage it views."""
    storage = target._storage
    if not target._chain and value.shape == storage.root.shape:
        storage.root = Ref(value.node, value.index, value.chain, value.shape, storage.root.dtype)
        return
    node = Node("write", args=(storage.root, target._chain, value), dtypes=storage.root.dtype)
    storage.root = Ref(node, None, (), storage.root.shape, storage.root.dtype)


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
    if any(isinstance(x, Ref) for x in pytree.tree_leaves(rest, is_leaf=lambda x: isinstance(x, Ref))):
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
        storage.root = Ref(Node("const", value=base, dtypes=base.dtype), None, (),
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
            and args[1].dtype == args[0].dtype and native(args[1].dtype):
        # A host value copied in (load_state_dict): the recipe is that value, held on the host.
        _assign(args[0], const_recipe(args[1]))
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
    return any(isinstance(x, FakeTensor) for x in leaves) or \
        torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


class LazyMode(TorchDispatchMode):
    """Active inside `backend.device` with lazy initialisation: factories make recipes."""

    def __init__(self, backend):
        super().__init__()
        self.backend = backend

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {}, inside=True, backend=self.backend)
