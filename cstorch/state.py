"""The run's state: every tensor a step reads or writes, owned by name on the device.

Each piece of state is a `Cell` (`bridge.device_tensor`) holding one `jax.Array`, named
after the first place that holds it (``model.0.weight``, ``optimizer.state.0.momentum_buffer``,
``optimizer.param_groups.0.lr``, ``optimizer.lr_scheduler0.last_epoch``). The torch side
holds `DeviceTensor`s of those cells, so no write path can leave the two apart.

An `Entry` is one place that holds a state tensor: a key of a dict (a module's
`_parameters` or `_buffers`, an optimizer's per-parameter state, a param group, a
scheduler's counters) or an index of a list (a param group's `params`). Entries read and
write their torch-side tensor; that single protocol serves modules, optimizers and
schedulers alike. A tensor found at an entry that is not one of the run's device tensors
(a new `nn.Parameter` assigned to a module, a state tensor loaded by `load_state_dict`)
is adopted: uploaded into a cell and replaced by a device tensor of it.
"""
import dataclasses
import sys
import weakref
from dataclasses import dataclass

import numpy as np
import torch
import jax
from jax.experimental import multihost_utils

import wafer
from bridge import tensors_to_jax, to_jax_dtype
from bridge.capture import with_user_line
from bridge.convert import local_value, put_global
from bridge.device_tensor import Absent, Cell, DeviceTensor, requires_grad_writes
from wafer.host_memory import fit_to_state, own_mappings, release_freed_host_memory
from cstorch.errors import StepRefusedError
from cstorch.metrics.metric import state_prefix
from cstorch.run.capture_context import is_capturing
from cstorch.weak_registry import WeakRegistry

_DROPPED = {
    "compile_only": "the backend is compile_only: no step is executed, so no value is computed",
    "validate_only": "the backend is validate_only: no step is executed, so no value is computed",
    "drop_data": "the backend was created with drop_data=True, which drops every state value; "
                 "load a checkpoint with values for every state tensor (model.load_state_dict, "
                 "optimizer.load_state_dict) before reading or running",
}


@dataclass
class Entry:
    name: str
    table: object     # the dict or list that holds the tensor
    key: object
    tensor: torch.Tensor
    cell: int = -1    # index into RunState.cells
    # A weak reference to the model, optimizer, metric or holder the entry belongs to:
    # once that is gone, so is the entry (`RunState.drop_dead`).
    owner: object = None

    def get(self):
        return self.table[self.key]

    def set(self, value):
        if isinstance(self.table, list):
            self.table[self.key] = value
        else:
            dict.__setitem__(self.table, self.key, value)


class TrackedTable(dict):
    """A compiled module's `_parameters`, `_buffers` or `_modules`: an assignment or removal
    (a new Parameter, a replaced submodule, weights tied after compile) marks the run's
    state for re-registration before the next step. A new entry while a step is captured
    is refused: it would hold a traced value once the capture ends."""

    def __init__(self, table, state: "RunState", kind: str = ""):
        super().__init__(table)
        self.state = state
        self.kind = kind

    def __setitem__(self, key, value):
        if key not in self and is_capturing():
            raise StepRefusedError(self._added_in_capture(key))
        super().__setitem__(key, value)
        self.state.dirty = True

    def _added_in_capture(self, key) -> str:
        what = {"_parameters": "parameter", "_buffers": "buffer", "_modules": "submodule"}
        owner = next((name for name, m in self.state.named_modules()
                      if m.__dict__.get(self.kind) is self), "a compiled module")
        return with_user_line(
            f"the traced step registered a new {what.get(self.kind, 'entry')} {key!r} on "
            f"{owner}: a program cannot add state to the run. Create it before "
            f"cstorch.compile (in the module's __init__; a mask for the longest sequence, "
            f"sliced in forward), or use a plain tensor if it needs no keeping")

    def __delitem__(self, key):
        super().__delitem__(key)
        self.state.dirty = True

    def pop(self, *args):
        self.state.dirty = True
        return super().pop(*args)

    def __reduce_ex__(self, protocol):
        return dict, (dict(self.items()),)


class RunState:
    """Every state cell of a backend, its entries, and the names that key them."""

    # Read through the class: at interpreter exit this module's globals may already be gone.
    _exiting = staticmethod(sys.is_finalizing)

    def __init__(self, backend):
        self.backend = backend
        self.cells: list[Cell] = []
        self.names: list[str] = []
        self.entries: list[Entry] = []
        self.dirty = False
        # Bumped whenever the set of cells or entries changes: programs are keyed by it.
        self.version = 0
        self.complete_at = -1   # the version at which every cell was known to have a value
        self.index: dict[int, int] = {}  # id(cell) -> its position in `cells`
        # Weak references: the state must not keep a model the user dropped alive.
        self._submodules: list = []         # every submodule, for its train/eval flag
        self._named_submodules: list = []   # (qualified name, submodule), each once
        # Metrics a traced step used that no compiled module holds: state as metrics.<name>.
        self.metrics = WeakRegistry(self._owner_dropped)
        self._holders: list = []   # (prefix, weak ref) of state outside models and metrics
        self._watched: list[Entry] = []
        self._flags = (None, ())
        self.arrays_list: list = []
        # Whether some cells hold a `Row` of a stacked array (`tracing.state_slots`).
        self.holds_rows = False
        self.grads_from = None  # the program whose gradients the parameters' slots show
        # During a refresh: id(host tensor) -> (host tensor, device tensor that replaced it),
        # so a tensor held in two places (tied weights, an optimizer's params) stays one cell.
        self._replaced = {}
        self._moved_bytes = 0   # of host tensors moved to the device by this refresh
        self._uploads = []      # (cell, host tensor, sharding) adopted, not yet uploaded
        self._upload_bytes = 0  # their size
        self._initial = False
        self._progress = None
        # Dropping what an owner held waits while the state is in use (a step being
        # captured or run, a refresh): `in_use`.
        self.in_use = _InUse(self)
        self._owner_died = False
        self._caches: list = []   # weak references to the program caches of traced steps

    # registration ------------------------------------------------------------------
    def refresh(self, initial: bool = False, progress=None):
        """Walk every compiled module and optimizer, adopt what is new, rebuild the entries.

        `initial`: what is adopted is a model's or optimizer's initial state, which a
        drop_data backend drops (a loaded checkpoint, adopted later, is kept). `progress`
        (a tqdm bar) advances once per tensor adopted."""
        with self.in_use, own_mappings():
            self._refresh(initial, progress)

    def _refresh(self, initial, progress):
        self.dirty = False
        self._initial = initial
        self._progress = progress
        self._replaced = {}
        self._moved_bytes = 0
        index: dict[int, int] = {}
        cells, names, entries = [], [], []

        def add(name, table, key, tensor, owner):
            tensor = self._adopt(table, key, tensor)
            i = index.get(id(tensor.cell))
            if i is None:
                i = index[id(tensor.cell)] = len(cells)
                cells.append(tensor.cell)
                names.append(name)
            entries.append(Entry(name, table, key, tensor, i, owner))

        submodules, named = [], []
        try:
            self._walk_modules(add, submodules, named)
            replaced = {k: v for k, (_, v) in self._replaced.items()}
            for opt in self.backend.optimizers:
                owner = weakref.ref(opt)
                for name, table, key, tensor in opt.state_entries(replaced):
                    add(name, table, key, tensor, owner)
        finally:
            # The values adopted last go to the device (`_UPLOAD_BATCH_BYTES`).
            self._upload_pending()
        if self.backend.distributed:
            _take_main_process_values([device.cell for _, device in self._replaced.values()],
                                      self.backend.process_group.is_main)
        self._replaced = {}   # the last references to the host copies moved to the device
        release_freed_host_memory(self._moved_bytes)
        self._moved_bytes = 0
        self._progress = None
        self._submodules = submodules
        self._named_submodules = named
        self._install(cells, names, entries, index)

    def _walk_modules(self, add, submodules, named):
        """`add` every parameter and buffer of the run's modules; collect (weak references
        to) every submodule in `submodules` and each once, named, in `named`."""
        seen = set()
        for prefix, module in self._modules():
            owner = weakref.ref(module)
            for mod_name, sub in module.named_modules(remove_duplicate=False):
                submodules.append(weakref.ref(sub))
                if id(sub) not in seen:
                    seen.add(id(sub))
                    named.append((f"{prefix}.{mod_name}" if mod_name else prefix, weakref.ref(sub)))
                for kind in ("_parameters", "_buffers", "_modules"):
                    if not isinstance(sub.__dict__[kind], TrackedTable):
                        sub.__dict__[kind] = TrackedTable(sub.__dict__[kind], self, kind)
                for kind in ("_parameters", "_buffers"):
                    table = sub.__dict__[kind]
                    for key, tensor in list(dict.items(table)):
                        if tensor is not None:
                            add(".".join(p for p in (prefix, mod_name, key) if p), table, key,
                                tensor, owner)

    def _upload_pending(self):
        """Give the cells adopted with a host value their device arrays, in one transfer."""
        if self._uploads:
            cells, tensors, shardings = zip(*self._uploads)
            self._uploads, self._upload_bytes = [], 0
            for cell, array in zip(cells, tensors_to_jax(tensors, shardings)):
                cell.array = array

    def _install(self, cells, names, entries, index):
        """Make `cells`, named `names`, and `entries` the run's state."""
        changed = [id(c) for c in cells] != [id(c) for c in self.cells] or \
            [(e.cell, id(e.table), e.key) for e in entries] != \
            [(e.cell, id(e.table), e.key) for e in self.entries]
        # A cell leaving the run (its tensor replaced, its model dropped) keeps its own
        # value, not the run's old list of every value.
        for c in self.cells:
            if id(c) not in index:
                c.store, c.index = [c.array], 0
        self.cells, self.names, self.entries = cells, names, entries
        # One list holds every cell's value: a step's results replace it in one assignment.
        self.arrays_list = [c.array for c in cells]
        for i, c in enumerate(cells):
            c.store, c.index = self.arrays_list, i
        # Module tables report their own writes; other entries are checked before each step.
        self._watched = [e for e in entries if not isinstance(e.table, TrackedTable)]
        self.index = index
        if changed:
            self.version += 1
            fit_to_state(sum(a.nbytes for a in self.arrays_list if isinstance(a, jax.Array)))

    # models the user dropped -----------------------------------------------------------
    def _owner_dropped(self):
        """A model, optimizer, metric or holder was collected: its state goes now, or
        when the state is no longer in use. Called from the garbage collector.

        Not at interpreter exit: every owner goes then and the process frees all. Rebuilding
        the state once per owner would allocate while modules are torn down, and the
        collections that triggers call JAX's callback after JAX's own module is cleared."""
        if self._exiting():
            return
        self._owner_died = True
        if not self.in_use.depth:
            self.drop_dead()

    def drop_dead(self):
        """Forget the entries of every owner that no longer exists, and the cells only
        they held, so that their arrays are freed. Programs captured for the old layout
        can never run again (the layout is part of their key): the traced steps' caches
        drop them, with the gradients and values they keep."""
        self._owner_died = False
        entries = [e for e in self.entries if e.owner is None or e.owner() is not None]
        self._submodules = [r for r in self._submodules if r() is not None]
        self._named_submodules = [(n, r) for n, r in self._named_submodules if r() is not None]
        self._holders = [(p, r) for p, r in self._holders if r() is not None]
        if len(entries) == len(self.entries):
            return
        index: dict[int, int] = {}
        cells, names, kept = [], [], []
        for e in entries:
            cell = self.cells[e.cell]
            i = index.get(id(cell))
            if i is None:
                i = index[id(cell)] = len(cells)
                cells.append(cell)
                names.append(e.name)
            kept.append(dataclasses.replace(e, cell=i))
        self._install(cells, names, kept, index)
        self.grads_from = None
        for ref in self._caches:
            cache = ref()
            if cache is not None:
                cache.drop_layouts_before(self.version)
        self._caches = [r for r in self._caches if r() is not None]

    def note_cache(self, cache):
        """Tell the state of a traced step's program cache, whose programs for an old
        layout it drops when an owner's state goes (`drop_dead`)."""
        if not any(r() is cache for r in self._caches):
            self._caches.append(weakref.ref(cache))

    def modules(self):
        """Every submodule of the compiled modules (their train/eval flags key programs)."""
        return [m for r in self._submodules if (m := r()) is not None]

    def named_modules(self):
        """(qualified name, module) of every submodule of the compiled modules, each once."""
        return [(n, m) for n, r in self._named_submodules if (m := r()) is not None]

    @property
    def holders(self) -> list:
        """(prefix, module) of the state outside models and metrics (a grad scaler's)."""
        return [(p, m) for p, r in self._holders if (m := r()) is not None]

    def _modules(self):
        named = [("model" if i == 0 else f"model{i}", m) for i, m in self.backend.modules.items()]
        return named + self._metric_modules() + self.holders

    def add_holder(self, prefix: str, module: torch.nn.Module) -> str:
        """Make the buffers of `module`, which belongs to no model (a grad scaler's
        scale), state of the run, named ``<prefix>.<buffer>`` (a suffix tells equal
        prefixes apart). The state holds `module` weakly: its owner keeps it. Returns the
        prefix used."""
        used = {p for p, _ in self.holders}
        name, k = prefix, 1
        while name in used:
            name, k = f"{prefix}{k}", k + 1
        self._holders.append((name, weakref.ref(module, lambda _: self._owner_dropped())))
        self.refresh(initial=True)
        return name

    def add_metric(self, metric):
        """Make a `cstorch.metrics.Metric` that no compiled module holds state of the run,
        its accumulators named ``metrics.<name>.<accumulator>``, from the next step on."""
        if metric not in self.metrics:
            self.metrics.append(metric)
            self.dirty = True

    def _metric_modules(self):
        """(prefix, metric) of the registered metrics; one that a compiled module came to
        hold is state of that module instead. Equal names are told apart by a suffix."""
        metrics = list(self.metrics)
        held = {id(sub) for m in self.backend.modules for sub in m.modules()} if metrics else ()
        named, used = [], set()
        for metric in metrics:
            if id(metric) in held:
                continue
            prefix = base = state_prefix(metric.name)
            k = 1
            while prefix in used:
                prefix, k = f"{base}_{k}", k + 1
            used.add(prefix)
            named.append((prefix, metric))
        return named

    def _adopt(self, table, key, tensor):
        """The run's device tensor for what `table[key]` holds, uploading it if needed."""
        if isinstance(tensor, DeviceTensor) and not tensor.is_view:
            return tensor
        if id(tensor) in self._replaced:
            device = self._replaced[id(tensor)][1]
            if isinstance(table, list):
                table[key] = device
            else:
                dict.__setitem__(table, key, device)
            return device
        sharding = wafer.state_sharding(self.backend.mesh, tuple(tensor.shape))
        dropped = self.backend.drops_data
        if dropped == "drop_data" and not self._initial:
            dropped = None
        upload = None
        if dropped is None:
            value = _built_on_device(tensor, sharding)
            if value is None:
                if isinstance(tensor, DeviceTensor):
                    self._upload_pending()   # the view may read a cell adopted just now
                    tensor = tensor.host()
                upload, value = tensor.detach(), _UPLOAD_PENDING
            self._moved_bytes += tensor.numel() * tensor.element_size()
        else:
            kept = dropped != "drop_data"
            if isinstance(tensor, DeviceTensor):
                self._upload_pending()
                tensor = tensor.host()
            value = Absent(tensor.shape, to_jax_dtype(tensor.dtype), sharding,
                           tensor.detach() if kept else None, _DROPPED[dropped])
        cell = Cell(value, tensor.dtype)
        if upload is not None:
            self._uploads.append((cell, upload, sharding))
            self._upload_bytes += upload.numel() * upload.element_size()
            if self._upload_bytes >= _UPLOAD_BATCH_BYTES:
                self._upload_pending()
        device = DeviceTensor(cell, shape=tuple(tensor.shape))
        if isinstance(tensor, torch.nn.Parameter):
            device = torch.nn.Parameter(device, requires_grad=tensor.requires_grad)
        elif tensor.requires_grad:
            device.requires_grad_(True)
        _carry_gradient_hooks(tensor, device)
        if isinstance(table, list):
            table[key] = device
        else:
            dict.__setitem__(table, key, device)
        self._replaced[id(tensor)] = (tensor, device)
        if self._progress is not None:
            self._progress.update(1)
        return device

    def sync(self):
        """Before a step: adopt whatever the torch side put in place of a state tensor."""
        if self.dirty:
            self.refresh()
            return
        for e in self._watched:
            if e.table[e.key] is not e.tensor:
                self.refresh()
                return

    # values ------------------------------------------------------------------------
    def arrays(self) -> dict:
        return {name: cell.array for name, cell in zip(self.names, self.cells)}

    def load(self, arrays: dict):
        """Replace values by name (a restored checkpoint)."""
        for name, cell in zip(self.names, self.cells):
            cell.array = arrays[name]

    def tensor(self, name) -> torch.Tensor:
        """The device tensor of the cell called `name`."""
        i = self.names.index(name)
        return next(e.tensor for e in self.entries if e.cell == i)

    def absent(self) -> list:
        """Names of the state tensors that have no value on the device."""
        return [name for name, cell in zip(self.names, self.cells)
                if isinstance(cell.array, Absent)]

    def requires_grad_key(self) -> tuple:
        """`requires_grad` of every state tensor, looked at again only after one was set."""
        seen = (self.version, requires_grad_writes())
        if self._flags[0] != seen:
            self._flags = (seen, tuple([e.tensor.requires_grad for e in self.entries]))
        return self._flags[1]

    def grad_param(self, cell):
        """The parameter (a device tensor requiring grad) held in `cell`, or None."""
        for e in self.entries:
            if e.cell == cell and e.tensor.requires_grad:
                return e.tensor
        return None

    def has_grad(self, cell) -> bool:
        """Whether the parameter held in `cell` has a gradient now."""
        param = self.grad_param(cell)
        return param is not None and param.has_grad()

    def held_tensor(self, cell):
        """The tensor (a parameter, a buffer, an optimizer state tensor) held in `cell`."""
        return next(e.tensor for e in self.entries if e.cell == cell)

    def grad_flags(self):
        """Per cell: whether its tensor requires a gradient."""
        flags = [False] * len(self.cells)
        for e in self.entries:
            if e.tensor.requires_grad:
                flags[e.cell] = True
        return flags


class _InUse:
    """`with state.in_use:` around whatever relies on the state's layout staying as it
    is (a step's capture and call, a refresh): an owner dropped meanwhile has its state
    dropped at the end."""
    __slots__ = ("state", "depth")

    def __init__(self, state):
        self.state, self.depth = state, 0

    def __enter__(self):
        self.depth += 1

    def __exit__(self, *exc):
        self.depth -= 1
        if not self.depth and self.state._owner_died:
            self.state.drop_dead()


def _take_main_process_values(cells, is_main: bool):
    """Make newly adopted state equal on every process of a multi-process run: the main
    process's values win (as DistributedDataParallel broadcasts rank 0's module state), so
    processes whose models were initialised differently cannot train apart."""
    cells = [c for c in cells if not isinstance(c.array, Absent)]
    if not cells:
        return
    values = multihost_utils.broadcast_one_to_all([local_value(c.array) for c in cells],
                                                  is_source=is_main)
    for cell, value in zip(cells, values):
        cell.array = put_global(np.asarray(value), cell.array.sharding)


def _built_on_device(tensor, sharding):
    """The device array of a lazily created tensor (`cstorch.zeros`, ..., or one made
    inside `backend.device`, `cstorch.lazy_init`), built on the device, never on the host;
    None for any other tensor."""
    # Looked up on the type: an attribute read on a lazy tensor itself could build it.
    device_value = getattr(type(tensor), "device_value", None)
    return None if device_value is None else device_value(tensor, sharding)


# What a cell holds from its adoption until the refresh uploads every new host value.
_UPLOAD_PENDING = object()
# Host values adopted are uploaded together once they reach this size, or at the refresh's
# end: batching pays off for small tensors, and a transfer makes a private copy of each
# value first, which a whole model's worth at once would add to the peak.
_UPLOAD_BATCH_BYTES = 64 << 20



def _carry_gradient_hooks(tensor, device):
    """Hooks registered on a tensor before compile run on its device tensor, and the
    handles taken then still remove them: the device tensor holds the very same hook
    tables."""
    for table in ("_backward_hooks", "_post_accumulate_grad_hooks"):
        # Read past the subclass: a lazily created tensor would materialise on attribute reads.
        with torch._C.DisableTorchFunctionSubclass():
            hooks = getattr(tensor, table, None)
        if hooks:
            setattr(device, table, hooks)
