"""`SparsityAlgorithm`: the base of cstorch's sparsity algorithms.

A sparse parameter is its dense tensor and a bool mask, registered on the module that owns
the parameter as the buffer ``<name>_mask`` (so it is state of the run, saved with the
model's `state_dict`, and the checkpoint shows which parameters were sparse). The
algorithm keeps the parameter equal to ``dense * mask``:

- ``model.apply(sparsity)`` chooses the parameters and makes each mask (`init_method`, at
  the sparsity level of step 0); as in the reference, the weights keep their values until
  the owning module's next forward;
- before each forward of an owning module the mask is multiplied into the parameter
  (a value written in between, say by `load_state_dict`, is masked too), and a gradient
  hook multiplies it into the parameter's gradient after backward (for RigL, which reads
  the dense gradient, the gradient is masked in `optimizer.step()`'s pre-hook instead);
- ``optimizer.apply(sparsity)`` masks the gradients before each `optimizer.step()` and,
  after it, advances the algorithm's step counter, lets a dynamic algorithm update its
  masks, and multiplies the masks into the parameters and into every optimizer state
  tensor of the parameter's shape.

All of it is torch ops on the tensors the module and the optimizer hold at that moment, so
it runs the same eagerly and inside `@cstorch.trace` (where those are the traced
stand-ins): the masks, the counter and the parameters are state, and their updates are
outputs of the compiled step. A dynamic algorithm's update is computed at every traced step
and selected by a tensor condition (the step is not known while tracing); eagerly it is
skipped when the step is not an update step. Both give the same values.

A parameter is left dense when ``param.requires_dense`` is True, and an optimizer state
tensor when its ``requires_dense`` is True.
"""
import sys
import weakref
from abc import ABC
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch.utils.hooks import RemovableHandle

from cstorch.compile import CompiledModule
from cstorch.run.capture_context import is_capturing
from cstorch.sparse.init import initial_mask, make_init_method
from cstorch.sparse.utils import HyperParameterSchedule, make_hyperparameter_schedule


@dataclass(eq=False)
class SparseParameter:
    """One sparsified parameter: the module that owns it, its key there and its full name
    (relative to the module `model.apply` was called on)."""
    module: torch.nn.Module
    key: str
    name: str
    algorithm: "SparsityAlgorithm"

    @property
    def mask_name(self) -> str:
        return f"{self.key}_mask"

    @property
    def param(self) -> torch.Tensor:
        """The tensor the module holds now (a traced stand-in inside a capture)."""
        return self.module._parameters[self.key]

    @property
    def mask(self) -> torch.Tensor:
        return self.module._buffers[self.mask_name]


def _apply_root(module):
    """The module `torch.nn.Module.apply` was first called on, when this call comes from
    inside it: parameter names are relative to it. ``Module.apply`` visits children before
    their parent, so without this a child would see its parameters under short names."""
    code = torch.nn.Module.apply.__code__
    root = module
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is code:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, torch.nn.Module):
                root = candidate
        frame = frame.f_back
    return root


def _in_module_apply() -> bool:
    """Whether this call comes from `torch.nn.Module.apply` (through `__call__`)."""
    code = torch.nn.Module.apply.__code__
    frame = sys._getframe(2)
    for _ in range(3):
        if frame is None:
            return False
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


class SparsityAlgorithm(ABC):  # noqa: B024 (abstract by the reference, not by methods)
    """Base class of sparsity algorithms.

    ``sparsity``: the fraction of each chosen parameter's weights that are zero, in
    [0, 1): a number, a schedule dict (``{"type": "cosine", ...}``, see
    `cstorch.sparse.utils`) or a `HyperParameterSchedule`. ``init_method``: how masks
    start (`cstorch.sparse.init`). ``param_filter``: which parameters to sparsify, a glob of
    their names, a list of globs, or a callable ``(name, param) -> bool``; None takes
    every parameter (`cstorch.sparse.configure` defaults to
    `default_sparse_param_filter`).

    ``algorithm`` is accepted (and must name this class) so that a configuration dict
    can be passed as keyword arguments.
    """

    #: Whether the algorithm changes its masks during training.
    dynamic = False

    def __init__(self, sparsity, init_method="random"):
        name = type(self).__name__
        self._sparsity = None if sparsity is None else _sparsity_schedule(sparsity, name)
        self.init_method = make_init_method(init_method)
        #: Which parameters `sparsify_module` takes (a `Group` entry sets it; None: all).
        self.param_filter = None
        self.sparse_params: OrderedDict[str, SparseParameter] = OrderedDict()
        self.optimizers = []
        #: Update the masks after every `optimizer.step()`; when False, call `update()`.
        self.autoupdate = True
        self._target_hooks = OrderedDict()
        self._computed_hooks = OrderedDict()
        self._by_module = {}        # id(module) -> [SparseParameter]
        self._grad_hooked = {}      # id(tensor) -> weakref of the tensor with a grad hook
        self._counters = {}         # id(optimizer) -> (optimizer, counter key or tensor)
        self._handles = []
        self._pending_step = None   # a loaded step for an optimizer not applied yet
        self._dense_grads = {}      # id(param) -> its gradient before masking (this step)
        self._step = None           # the counter while masks are being updated
        self._current_name = None   # the parameter whose mask `update_mask` computes

    @property
    def sparsity(self):
        """The sparsity level as a schedule of the step (`cstorch.sparse.utils`): called
        with the step it gives the fraction of each sparse parameter's weights that are
        zero."""
        return self._sparsity

    @sparsity.setter
    def sparsity(self, value):
        self._sparsity = (None if value is None
                          else _sparsity_schedule(value, type(self).__name__))

    # applying ------------------------------------------------------------------------------
    def __call__(self, obj):
        return self.apply(obj)

    def apply(self, obj):
        """Sparsify the parameters of a module and its submodules (``model.apply(sparsity)``
        calls this on each submodule, and each does its own) or hook an optimizer
        (``optimizer.apply(sparsity)``)."""
        if isinstance(obj, CompiledModule):
            obj = obj.module
        if isinstance(obj, torch.nn.Module):
            if _in_module_apply():
                self.sparsify_module(obj)   # Module.apply visits every submodule itself
                return
            self._walk_root = obj
            try:
                for sub in obj.modules():
                    self.sparsify_module(sub)
            finally:
                self._walk_root = None
        elif isinstance(obj, torch.optim.Optimizer):
            self.sparsify_optimizer(obj)
        else:
            raise TypeError(f"{type(self).__name__} applies to a torch.nn.Module or an "
                            f"optimizer, got {type(obj).__name__}")

    def _choose(self, name, param):
        """The algorithm that sparsifies `param` (named `name`), or None."""
        if self.param_filter is None or self.param_filter(name, param):
            return self
        return None

    def sparsify_module(self, module: torch.nn.Module):
        """Sparsify the parameters `module` itself owns that the filter takes. Names are
        full names: relative to the module ``model.apply(sparsity)`` was called on when
        this comes from it, else to `module`."""
        root = getattr(self, "_walk_root", None) or _apply_root(module)
        prefix = self._prefix_in(root, module)
        for key, param in list(module._parameters.items()):
            if param is None or not param.is_floating_point():
                continue
            if getattr(param, "requires_dense", False) or f"{key}_mask" in module._buffers:
                continue
            name = f"{prefix}.{key}" if prefix else key
            algorithm = self._choose(name, param)
            if algorithm is not None:
                algorithm._sparsify(module, key, name)

    def _prefix_in(self, root, module) -> str:
        """`module`'s name inside `root` (cached per root: `model.apply` asks once per
        submodule)."""
        if root is module:
            return ""
        cached = getattr(self, "_prefixes", None)
        if cached is None or cached[0]() is not root or id(module) not in cached[1]:
            names = {}
            for prefix, sub in root.named_modules(remove_duplicate=False):
                names.setdefault(id(sub), prefix)
            cached = self._prefixes = (weakref.ref(root), names)
        return cached[1].get(id(module), "")

    def sparsify_parameter(self, module: torch.nn.Module, name: str, param: torch.Tensor):
        """Sparsify the parameter `param` that `module` holds as `name`: make its mask
        (`init_method`, at the level of step 0) and register it on `module` as the buffer
        ``<name>_mask``. The weights themselves are masked before the module's next
        forward, as in the reference."""
        if module._parameters.get(name) is not param:
            raise ValueError(f"sparsify_parameter: {type(module).__name__} holds no parameter "
                             f"{name!r} that is the tensor given")
        return self._sparsify(module, name, name)

    def _sparsify(self, module, key, name):
        if self.sparsity is None:
            raise ValueError(f"{type(self).__name__} has no sparsity level: pass sparsity=")
        param = module._parameters[key]
        level = self.sparsity.value_at(0)
        mask = initial_mask(self.init_method, param, level, name)
        module.register_buffer(f"{key}_mask", mask)
        sp = SparseParameter(module, key, name, self)
        self.sparse_params[name] = sp
        self.csx_annotate_sparsity(sp)
        if id(module) not in self._by_module:
            self._by_module[id(module)] = []
            self._handles.append(module.register_forward_pre_hook(self._before_forward))
        self._by_module[id(module)].append(sp)
        return sp

    def csx_annotate_sparsity(self, param):  # noqa: B027 (nothing to do here, by design)
        """Tell the wafer compiler the sparsity of `param` (a `SparseParameter`). Nothing
        to do here: the masks are applied as ordinary ops, which every backend lowers."""

    def get_sparse_params(self, obj):
        """The `SparseParameter`s of `obj`: a module (those of its parameters and its
        submodules'), an optimizer (those it steps), or a tensor (its own, or None)."""
        if isinstance(obj, CompiledModule):
            obj = obj.module
        if isinstance(obj, torch.nn.Module):
            ids = {id(p) for p in obj.parameters()}
        elif isinstance(obj, torch.optim.Optimizer):
            ids = {id(p) for group in obj.param_groups for p in group["params"]}
        elif isinstance(obj, torch.Tensor):
            return next((sp for sp in self.sparse_params.values() if sp.param is obj), None)
        else:
            raise TypeError(f"get_sparse_params takes a module, an optimizer or a tensor, got "
                            f"{type(obj).__name__}")
        return [sp for sp in self.sparse_params.values() if id(sp.param) in ids]

    @torch.no_grad()
    def prune_weight(self, sparse_param):
        """Multiply the mask of `sparse_param` (a `SparseParameter`) into its weights."""
        sparse_param.param.mul_(sparse_param.mask)

    def visit_state(self, f):
        """Call ``f(tensor)`` on each tensor of the algorithm's state (every mask, the step
        counters); a tensor `f` returns replaces the one given."""
        for sp in self.sparse_params.values():
            new = f(sp.mask)
            if isinstance(new, torch.Tensor) and new is not sp.mask:
                sp.module._buffers[sp.mask_name] = new
        for key, (holder, where) in list(self._counters.items()):
            counter = self._counter(holder)
            new = f(counter)
            if isinstance(new, torch.Tensor) and new is not counter:
                if isinstance(where, str):
                    holder.schedule_state[where] = new
                else:
                    self._counters[key] = (holder, new)

    @property
    def num_sparse_params(self) -> int:
        """How many parameters this algorithm sparsified."""
        return len(self.sparse_params)

    def sparsify_optimizer(self, optimizer: torch.optim.Optimizer):
        """Mask gradients before each step of `optimizer`; after it, update and apply the
        masks to the parameters and their optimizer state."""
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"expected an optimizer, got {type(optimizer).__name__}")
        if id(optimizer) in self._counters:
            return
        counter = torch.tensor(0.0 if self._pending_step is None else float(self._pending_step))
        self._pending_step = None
        if hasattr(optimizer, "schedule_state"):
            # A cstorch optimizer: the counter is device state beside its schedules'.
            n = sum(1 for k in optimizer.schedule_state if k.startswith("sparsity"))
            key = f"sparsity{n}.step"
            optimizer.schedule_state[key] = counter
            self._counters[id(optimizer)] = (optimizer, key)
        else:
            self._counters[id(optimizer)] = (optimizer, counter)
        self.optimizers.append(optimizer)
        self._handles.append(optimizer.register_step_pre_hook(self._before_step))
        self._handles.append(optimizer.register_step_post_hook(self._after_step))

    # hooks -----------------------------------------------------------------------------
    @torch.no_grad()
    def _before_forward(self, module, args):
        for sp in self._by_module.get(id(module), ()):
            param, mask = sp.param, sp.mask
            param.mul_(mask)
            if (param.requires_grad and not self.wants_dense_grads
                    and self._first_sight(param)):
                param.register_hook(self._grad_hook(sp))

    def _first_sight(self, tensor) -> bool:
        """Whether `tensor` has no gradient hook of this algorithm yet (it has one after)."""
        ref = self._grad_hooked.get(id(tensor))
        if ref is not None and ref() is tensor:
            return False
        if len(self._grad_hooked) > 256:  # forget the stand-ins of earlier captures
            self._grad_hooked = {k: r for k, r in self._grad_hooked.items() if r() is not None}
        self._grad_hooked[id(tensor)] = weakref.ref(tensor)
        return True

    def _grad_hook(self, sp):
        def hook(grad):
            return grad * sp.mask
        return hook

    #: Whether `update_mask` reads the gradients from before masking (`dense_grad`). Such
    #: an algorithm's gradients stay dense until `optimizer.step()`, whose pre-hook keeps
    #: them and then masks them (a gradient hook would see each micro-batch's gradient
    #: alone, and gradient accumulation over several backward passes would be lost).
    wants_dense_grads = False

    def dense_grad(self, p) -> torch.Tensor:
        """The gradient of `p` this step before it was masked (algorithms that set
        `wants_dense_grads`), zeros if it has none."""
        grad = self._dense_grads.get(id(p))
        if grad is None:
            grad = torch.zeros_like(p)
        return grad

    def _owned(self, optimizer):
        ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        return [sp for sp in self.sparse_params.values() if id(sp.param) in ids]

    @torch.no_grad()
    def _before_step(self, optimizer, args, kwargs):
        for sp in self._owned(optimizer):
            p = sp.param
            if p.grad is None:
                continue
            if self.wants_dense_grads:
                self._dense_grads[id(p)] = p.grad.clone()
            p.grad.mul_(sp.mask)

    @torch.no_grad()
    def _after_step(self, optimizer, args, kwargs):
        if self.autoupdate:
            self._update(optimizer)
        else:
            self._apply_masks(optimizer)

    def _apply_masks(self, optimizer):
        for sp in self._owned(optimizer):
            _mask_param_and_state(optimizer, sp.param, sp.mask)

    # updates ---------------------------------------------------------------------------
    def _counter(self, optimizer) -> torch.Tensor:
        holder, where = self._counters[id(optimizer)]
        if isinstance(where, str):
            return holder.schedule_state[where]
        return where

    @property
    def step(self):
        """The algorithm's step counter (optimizer steps taken), a tensor, or None before
        `optimizer.apply(sparsity)`."""
        if self._step is not None:
            return self._step
        if not self.optimizers:
            return None
        self.optimizers[0].state  # noqa: B018  (brings device values to the host when eager)
        return self._counter(self.optimizers[0])

    @torch.no_grad()
    def update(self, optimizer=None):
        """Advance the step counter, update the masks (dynamic algorithms, on update steps)
        and apply them to the parameters and optimizer state: what runs after every
        `optimizer.step()` unless `autoupdate` is False."""
        optimizers = self.optimizers if optimizer is None else [optimizer]
        for opt in optimizers:
            if id(opt) not in self._counters:
                raise RuntimeError(f"{type(self).__name__}.update: call optimizer.apply(sparsity) "
                                   "first")
            self._update(opt)

    def _update(self, optimizer):
        step = self._counter(optimizer)
        step.add_(1)
        self._step = step
        try:
            owned = self._owned(optimizer)
            if self.dynamic and owned:
                is_update = self.update_schedule(step)
                # Eagerly the update is skipped off its steps; traced, it is computed and
                # selected, the step's value being unknown while tracing.
                if is_capturing() or bool(is_update):
                    level = self.sparsity(step)
                    for sp in owned:
                        mask = sp.mask
                        self._current_name = sp.name
                        new = self.update_mask(sp.param, mask, level)
                        mask.copy_(torch.where(is_update, new.to(torch.bool), mask))
            for sp in owned:
                _mask_param_and_state(optimizer, sp.param, sp.mask)
                self._report(sp, step, sp.mask)
        finally:
            self._step = None
            self._current_name = None
            self._dense_grads.clear()

    def update_mask(self, p, mask, sparsity) -> torch.Tensor:
        """The new mask of `p` (whose current mask is `mask`) at the sparsity level
        `sparsity` (a float32 tensor), with torch ops; called on the update steps of a
        dynamic algorithm. `self.step` is the step counter meanwhile. A static pattern
        keeps `mask`."""
        return mask

    # sparsity hooks --------------------------------------------------------------------
    def register_target_sparsity_hook(self, hook) -> RemovableHandle:
        """``hook(algorithm, name, target)`` after every update, for every sparse
        parameter: `target` is the scheduled sparsity level (a tensor)."""
        handle = RemovableHandle(self._target_hooks)
        self._target_hooks[handle.id] = hook
        return handle

    def register_computed_sparsity_hook(self, hook) -> RemovableHandle:
        """``hook(algorithm, name, actual)`` after every update, for every sparse
        parameter: `actual` is the fraction of its mask that is False (a tensor)."""
        handle = RemovableHandle(self._computed_hooks)
        self._computed_hooks[handle.id] = hook
        return handle

    def _report(self, sp, step, mask):
        if self._target_hooks:
            target = self.sparsity(step)
            for hook in list(self._target_hooks.values()):
                hook(self, sp.name, target)
        if self._computed_hooks:
            actual = 1 - mask.sum().to(torch.float32) / mask.numel()
            for hook in list(self._computed_hooks.values()):
                hook(self, sp.name, actual)

    # masks by hand ---------------------------------------------------------------------
    @torch.no_grad()
    def prune_weights(self):
        """Multiply every mask into its parameter."""
        for sp in self.sparse_params.values():
            self.prune_weight(sp)

    @torch.no_grad()
    def initialize(self):
        """Make every mask afresh with `init_method` (at the level of step 0) and apply it."""
        level = self.sparsity.value_at(0)
        for sp in self.sparse_params.values():
            sp.mask.copy_(initial_mask(self.init_method, sp.param, level, sp.name))
            sp.param.mul_(sp.mask)

    # checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The step counter (the masks are buffers in the model's `state_dict`)."""
        step = self.step
        return {"step": 0 if step is None else int(step.item())}

    def load_state_dict(self, state_dict: dict):
        if "step" not in state_dict:
            raise KeyError(f"{type(self).__name__}.load_state_dict expects a 'step' entry, got "
                           f"{sorted(state_dict)}")
        value = float(state_dict["step"])
        if not self.optimizers:
            self._pending_step = value
            return
        for opt in self.optimizers:
            with torch.no_grad():
                self._counter(opt).fill_(value)

    def __repr__(self):
        return f"{type(self).__name__}(num_sparse_params={self.num_sparse_params})"

    @property
    def current_param_name(self):
        """The full name of the parameter `update_mask` is computing the mask of."""
        return self._current_name


def _mask_param_and_state(optimizer, p, mask):
    p.mul_(mask)
    state = optimizer.state.get(p) if hasattr(optimizer.state, "get") else None
    for value in (state or {}).values():
        if (isinstance(value, torch.Tensor) and value.shape == p.shape
                and value.is_floating_point() and not getattr(value, "requires_dense", False)):
            value.mul_(mask)




def _sparsity_schedule(sparsity, owner) -> HyperParameterSchedule:
    schedule = make_hyperparameter_schedule(sparsity, "sparsity")
    if isinstance(sparsity, (int, float)) and not 0 <= float(sparsity) < 1:
        raise ValueError(f"{owner}'s sparsity must be in [0, 1), got {sparsity}")
    return schedule

