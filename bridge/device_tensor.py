"""`DeviceTensor`: a torch tensor whose value is a `jax.Array`.

The value lives in a `Cell`, the one mutable holder of an immutable JAX array; every
tensor that aliases it (the tensor itself, `.data`, `detach()`, views such as `w[0]` or
`w.t()`) holds the same cell, so a write through any of them is seen by all, and a
traced step that replaces the cell's array is seen by every alias at once.

Outside a traced step, an ATen op on a device tensor runs as PyTorch's own CPU kernel on
a host copy of the value: reads get an ordinary tensor back; an op that writes into a
device tensor (in-place ops, `copy_`, `out=`, `.data` assignment) writes the result into
the cell. So `.data` writes, `nn.init`, `load_state_dict` and `with torch.no_grad():
w.clamp_(...)` can never be bypassed, while values stay on the device until read.
"""
import jax
import torch
import torch.utils._pytree as pytree

from bridge.convert import DeviceBacked, jax_to_tensor, tensor_to_jax, tensor_to_numpy

_aten = torch.ops.aten
_ALIASES = {_aten.detach.default, _aten.alias.default}
_GRAD = torch._C.TensorBase.grad
_REQUIRES_GRAD = torch._C.TensorBase.requires_grad
_flag_writes = [0]
# Ops that use only the shape and dtype of their tensor argument: they run without reading
# a value, so they work on state whose value is not there (drop_data, compile_only).
_VALUE_FREE = {_aten.zeros_like, _aten.ones_like, _aten.full_like, _aten.empty_like,
               _aten.rand_like, _aten.randn_like, _aten.randint_like, _aten.new_zeros,
               _aten.new_ones, _aten.new_full, _aten.new_empty, _aten.new_empty_strided}


def _shape_only(t) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype)


def requires_grad_writes() -> int:
    """How many times a device tensor's `requires_grad` was set: a cache of the flags needs
    looking at them again only when this changed."""
    return _flag_writes[0]


class Absent(jax.ShapeDtypeStruct):
    """A state value that is not on the device: its shape, dtype and layout only.

    Compilation needs nothing more, so runs that only compile or validate hold their state
    this way. `host_value` keeps the value on the host where there is one; without it the
    value is gone, and reading it raises an error that says `reason`.
    """
    __slots__ = ("host_value", "reason")

    def __init__(self, shape, dtype, sharding, host_value=None, reason="the value was dropped"):
        super().__init__(tuple(shape), dtype, sharding=sharding)
        self.host_value = host_value
        self.reason = reason

    def read(self) -> torch.Tensor:
        if self.host_value is None:
            raise RuntimeError(f"this tensor has no value: {self.reason}")
        return self.host_value


# Called before any device value is read on the host: what a caller checks once a step
# has run (cstorch's index checks) is raised there, before the value is seen.
host_read_hooks: list = []


class Row:
    """A value held as row `k` of a stacked array (`bridge.stacked_state`): a program that
    takes the stack takes it as it is; anything else reads the row."""
    __slots__ = ("stack", "k")

    def __init__(self, stack, k: int):
        self.stack, self.k = stack, k

    def read(self):
        return _row(self.stack, self.k)


# The row as an argument, so that reading every row of a stack compiles one program.
_row = jax.jit(lambda stack, k: jax.lax.dynamic_index_in_dim(stack, k, keepdims=False))


class Cell:
    """The mutable holder of one device value. `dtype` is the torch dtype the value has
    on the torch side (int64 for an array JAX holds as int32). The value is item `index`
    of the list `store`: a cell's own list, or one list a run keeps for all its state, so
    a step replaces every value with one slice assignment. An item may be a `Row` of a
    stacked array; reading `array` makes it an array of its own."""
    __slots__ = ("store", "index", "dtype", "__weakref__")

    def __init__(self, array, dtype: torch.dtype):
        self.store, self.index = [array], 0
        self.dtype = dtype

    @property
    def array(self):
        value = self.store[self.index]
        if type(value) is Row:
            value = self.store[self.index] = value.read()
        return value

    @array.setter
    def array(self, value):
        self.store[self.index] = value

    def host(self) -> torch.Tensor:
        """The value on the host. It may share memory with the device array: never write
        to it."""
        for hook in host_read_hooks:
            hook()
        array = self.array
        if isinstance(array, Absent):
            return array.read()
        return jax_to_tensor(array, self.dtype)

    def write(self, value: torch.Tensor):
        """Make a host tensor the new value, laid out as the old one was. A value kept on
        the host stays there; a dropped one is uploaded (a checkpoint being loaded)."""
        array = self.array
        if isinstance(array, Absent) and array.host_value is not None:
            self.array = Absent(array.shape, array.dtype, array.sharding,
                                value.detach().to(self.dtype).clone(), array.reason)
            return
        self.array = tensor_to_jax(value.to(self.dtype), array.sharding)


def _writes(func, i, name=None) -> bool:
    args = func._schema.arguments
    if name is not None:
        arg = next((a for a in args if a.name == name), None)
    else:
        arg = args[i] if i < len(args) else None
    return arg is not None and arg.alias_info is not None and arg.alias_info.is_write


class HostReads:
    """Python-side reads of a tensor subclass whose value is not in its own storage: each
    goes through `host()`, an ordinary CPU tensor with the value (a copy the caller may
    keep). Pickling (`torch.save`, `deepcopy` by default) gives that host tensor, so
    `torch.load(weights_only=True)` reads it as an ordinary tensor."""

    def host(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def item(self):
        return self.host().item()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def __index__(self):
        return int(self.item())

    def numpy(self, *, force=False):
        """The value as a read-only numpy array. In eager PyTorch the array shares the
        tensor's memory and writes into it change the tensor; here it is a host copy of
        the device value (or the device buffer itself), which a write could not reach the
        tensor through, so writes raise instead of being lost."""
        if self.requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                               "tensor.detach().numpy() instead.")
        a = tensor_to_numpy(self.host())
        a.flags.writeable = False
        return a

    def __array__(self, dtype=None, copy=None):
        a = self.numpy(force=True)
        if dtype is not None and a.dtype != dtype:
            if copy is False:   # numpy's protocol: refuse rather than copy
                raise ValueError(f"a {a.dtype} device tensor cannot be viewed as {dtype} "
                                 f"without a copy; pass copy=None or True")
            return a.astype(dtype)
        return a.copy() if copy else a

    def tolist(self):
        return self.host().tolist()

    def __reduce_ex__(self, protocol):
        value = self.host().requires_grad_(self.requires_grad)
        if getattr(self, "_is_param", False):
            value = torch.nn.Parameter(value, self.requires_grad)
        return value.__reduce_ex__(protocol)


class DeviceTensor(HostReads, DeviceBacked, torch.Tensor):
    """A torch tensor whose value is the JAX array in `cell`, seen through `view` (a chain
    of ATen view ops, empty for the whole value)."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, cell: Cell, view=(), shape=None, dtype=None, requires_grad=False):
        shape = cell.array.shape if shape is None else shape
        return torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype or cell.dtype, device="cpu", requires_grad=requires_grad)

    def __init__(self, cell: Cell, view=(), shape=None, dtype=None, requires_grad=False):
        self.cell = cell
        self.view_ops = view if type(view) is tuple else tuple(view)

    @classmethod
    def of(cls, array, dtype: torch.dtype, shape=None) -> "DeviceTensor":
        """A device tensor holding `array` (whose shape is `shape`, if known) in a cell of
        its own."""
        return cls(Cell(array, dtype), (), shape, dtype)

    @property
    def is_view(self) -> bool:
        return bool(self.view_ops)

    def _apply_view(self, base):
        for func, args, kwargs in self.view_ops:
            base = func(base, *args, **kwargs)
        return base

    def host(self) -> torch.Tensor:
        """The value as an ordinary CPU tensor (a copy the caller may keep and write)."""
        return self._apply_view(self.cell.host()).clone()

    # `.data` aliases the same cell; assigning it writes the cell.
    @property
    def data(self):
        return DeviceTensor(self.cell, self.view_ops, self.shape, self.dtype)

    @data.setter
    def data(self, value):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"can only assign a tensor to .data, got {type(value).__name__}")
        if tuple(value.shape) != tuple(self.shape) or value.dtype != self.dtype:
            raise RuntimeError(
                f"cannot assign a {value.dtype} tensor of shape {tuple(value.shape)} to the .data "
                f"of a {self.dtype} tensor of shape {tuple(self.shape)} whose value lives on the "
                "device; assign a new torch.nn.Parameter to the module attribute instead (or "
                "change dtypes, as model.double() does, before cstorch.compile)")
        if value is self or (isinstance(value, DeviceTensor) and value.cell is self.cell
                             and value.view_ops == self.view_ops):
            return
        with torch.no_grad():
            self.copy_(value)

    @property
    def requires_grad(self):
        return _REQUIRES_GRAD.__get__(self)

    @requires_grad.setter
    def requires_grad(self, value):
        _flag_writes[0] += 1
        _REQUIRES_GRAD.__set__(self, value)

    def requires_grad_(self, requires_grad=True):
        _flag_writes[0] += 1
        return super().requires_grad_(requires_grad)

    # gradients a traced step left: arrays until `.grad` is read ------------------------
    @property
    def grad(self):
        slot = self.__dict__.get("_grad_slot")
        if slot is not None and slot.pending():
            value = slot.take()
            _GRAD.__set__(self, None if value is None else DeviceTensor.of(value, self.dtype))
        return _GRAD.__get__(self)

    @grad.setter
    def grad(self, value):
        slot = self.__dict__.get("_grad_slot")
        if slot is not None:
            slot.take()
        _GRAD.__set__(self, value)

    def grad_slot(self) -> "GradSlot":
        """Where traced steps leave this tensor's gradient; the tensor is built when
        `.grad` is next read."""
        slot = self.__dict__.get("_grad_slot")
        if slot is None:
            slot = self.__dict__["_grad_slot"] = GradSlot()
            if self.requires_grad:
                # Eager autograd accumulates into the C++ gradient slot, past the property:
                # bring a pending gradient in first so accumulation starts from it.
                self.register_hook(self._materialize_grad)
        return slot

    def _materialize_grad(self, incoming):
        self.grad  # noqa: B018
        return None

    def grad_array(self):
        """The gradient's device array (None without one), without building a tensor."""
        slot = self.__dict__.get("_grad_slot")
        if slot is not None and slot.pending():
            return slot.peek()
        grad = _GRAD.__get__(self)
        return None if grad is None else tensor_to_jax(grad)

    def has_grad(self) -> bool:
        slot = self.__dict__.get("_grad_slot")
        if slot is not None and slot.pending():
            return slot.where is not None and slot.source.outputs is not None
        return _GRAD.__get__(self) is not None

    # host access without the dispatcher ---------------------------------------------
    def item(self):
        if not self.view_ops and not isinstance(self.cell.array, Absent):
            for hook in host_read_hooks:
                hook()
            return self.cell.array.item()
        return self.host_view().item()

    def __repr__(self, *, tensor_contents=None):
        text = repr(self.host().requires_grad_(self.requires_grad) if self.requires_grad
                    else self.host())
        return f"Parameter containing:\n{text}" if getattr(self, "_is_param", False) else text

    def __deepcopy__(self, memo):
        value = self.host()
        if getattr(self, "_is_param", False):
            out = torch.nn.Parameter(value, self.requires_grad)
        else:
            out = value.requires_grad_(self.requires_grad)
        memo[id(self)] = out
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _ALIASES:
            src = args[0]
            return DeviceTensor(src.cell, src.view_ops, src.shape, src.dtype)
        if func is _aten.set_.source_Tensor or func is _aten.set_.default:
            raise RuntimeError("Tensor.set_ cannot rebind a tensor whose value lives on the device")
        if func is _aten.copy_.default and isinstance(args[0], DeviceTensor) and not args[0].view_ops \
                and tuple(args[1].shape) == tuple(args[0].shape):
            # The whole value is replaced (load_state_dict): no need to read the old one.
            src = args[1].host_view() if isinstance(args[1], DeviceTensor) else args[1]
            args[0].cell.write(src.detach())
            return args[0]
        targets = [a for i, a in enumerate(args) if _writes(func, i)]
        targets += [v for k, v in kwargs.items() if _writes(func, 0, k)]
        written = [t for t in pytree.tree_leaves(targets) if isinstance(t, DeviceTensor)]
        if written:
            _write_through(func, args, kwargs, written)
            return None if not func._schema.returns else targets[0]
        read = _shape_only if func.overloadpacket in _VALUE_FREE else DeviceTensor.host_view
        host_args, host_kwargs = pytree.tree_map_only(DeviceTensor, read, (args, kwargs))
        out = func(*host_args, **host_kwargs)
        if func.is_view and isinstance(args[0], DeviceTensor):
            src = args[0]
            if isinstance(out, (list, tuple)):   # unbind, split, chunk: one view per piece
                return type(out)(
                    DeviceTensor(src.cell, src.view_ops + ((_Piece(func, i), tuple(args[1:]),
                                                            dict(kwargs)),), o.shape, o.dtype)
                    for i, o in enumerate(out))
            step = (func, tuple(args[1:]), dict(kwargs))
            return DeviceTensor(src.cell, src.view_ops + (step,), out.shape, out.dtype)
        return out

    def host_view(self) -> torch.Tensor:
        """The value on the host, possibly sharing memory with the device: read only."""
        return self._apply_view(self.cell.host())


class _Piece:
    """A view step that is one piece of a view op returning several (`unbind`, `split`,
    `chunk`): the op, then its `index`-th result."""
    __slots__ = ("func", "index")

    def __init__(self, func, index: int):
        self.func, self.index = func, index

    def __call__(self, base, *args, **kwargs):
        return self.func(base, *args, **kwargs)[self.index]

    def __eq__(self, other):
        return (type(other) is _Piece and other.func is self.func
                and other.index == self.index)

    def __hash__(self):
        return hash((self.func, self.index))


class GradSource:
    """The gradients the latest step of one program left, as it returned them, and how
    many steps of it have run."""
    __slots__ = ("outputs", "generation")

    def __init__(self):
        self.outputs, self.generation = None, 0

    def publish(self, outputs):
        self.outputs = outputs
        self.generation += 1

    def release(self):
        """Drop the gradients before the next step runs, when that step leaves none of
        them alive (it clears each one it is given): as eager's `zero_grad` frees them
        before the backward pass, so that they and the new ones are not held at once. A
        slot of a released source reads no gradient; arrays a user took stay theirs."""
        self.outputs = None


class GradSlot:
    """One tensor's place in a `GradSource`: `where` is None (the step leaves no gradient),
    ``(index, None, None)`` (output `index`), ``(index, offset, shape)`` (a part of a
    packed output) or ``(index, k, None)`` (row k of a stacked output). The gradient is
    pending until taken or overwritten."""
    __slots__ = ("source", "where", "seen")

    def __init__(self):
        self.source, self.where, self.seen = None, None, 0

    def bind(self, source: GradSource, where):
        self.source, self.where, self.seen = source, where, source.generation

    def pending(self) -> bool:
        return self.source is not None and self.seen != self.source.generation

    def peek(self):
        if self.where is None or self.source.outputs is None:
            return None
        index, offset, shape = self.where
        array = self.source.outputs[index]
        return array if offset is None else unpack((array, offset, shape))

    def take(self):
        if self.source is None:
            return None
        value = self.peek()
        self.seen = self.source.generation
        return value


def unpack(value):
    """The array a gradient slot's value stands for."""
    if type(value) is tuple:
        flat, offset, shape = value
        if shape is None:
            return _row(flat, offset)
        size = 1
        for d in shape:
            size *= d
        return flat[offset:offset + size].reshape(shape)
    return value


def _write_through(func, args, kwargs, written):
    """Run an op that writes into device tensors on writable host copies of their cells,
    then store each written cell's new value."""
    bases = {}
    for t in written:
        if id(t.cell) not in bases:
            bases[id(t.cell)] = (t.cell, t.cell.host().clone())

    def to_host(t):
        if any(t is w for w in written):
            return t._apply_view(bases[id(t.cell)][1])
        return t.host_view()

    host_args, host_kwargs = pytree.tree_map_only(DeviceTensor, to_host, (args, kwargs))
    func(*host_args, **host_kwargs)
    for cell, base in bases.values():
        cell.write(base)
