"""The run's state on the device, and the torch tensors that are a view of it.

The backend owns every registered parameter, buffer and optimizer-state tensor as a
`jax.Array`. The torch tensors keep their identity (optimizers and user code hold them)
and are brought up to date only when something reads them: module attribute access,
`parameters()`, `state_dict()`, `optimizer.state`. Writes go the other way through the
tensor's version counter: a tensor changed on the torch side since its last sync is
uploaded before the next step.
"""
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import torch

import wafer
from bridge import jax_to_tensor, tensor_to_numpy, to_jax_dtype


@dataclass
class Slot:
    name: str
    tensor: torch.Tensor
    locations: list = field(default_factory=list)  # (dict, key) pairs that hold `tensor`
    version: int = -1  # the tensor's _version when it last matched the device


class DeviceState:
    def __init__(self, backend):
        self.backend = backend
        self.slots: list[Slot] = []
        self._by_id: dict[int, int] = {}
        self.arrays: list = []
        self.device_newer = False
        self.capturing = False

    # registration ------------------------------------------------------------------
    def add(self, name: str, tensor: torch.Tensor, location=None) -> int:
        index = self._by_id.get(id(tensor))
        if index is None:
            index = len(self.slots)
            self.slots.append(Slot(name, tensor))
            self._by_id[id(tensor)] = index
            self.arrays.append(None)
        if location is not None and location not in self.slots[index].locations:
            self.slots[index].locations.append(location)
        return index

    def index_of(self, tensor) -> int | None:
        return self._by_id.get(id(tensor))

    def slot_of_location(self, location) -> int:
        for i, slot in enumerate(self.slots):
            if location in slot.locations:
                return i
        raise KeyError(location)

    def bind_location(self, name: str, location, tensor: torch.Tensor) -> int:
        """Make `tensor` the state held at `location`, replacing what was there."""
        for i, slot in enumerate(self.slots):
            if location in slot.locations:
                if slot.tensor is not tensor:
                    self._retarget(i, tensor)
                return i
        return self.add(name, tensor, location)

    def _retarget(self, i, tensor):
        self.sync_to_host()
        slot = self.slots[i]
        del self._by_id[id(slot.tensor)]
        slot.tensor, slot.version = tensor, -1
        self._by_id[id(tensor)] = i
        self.arrays[i] = None

    def register_module(self, module: torch.nn.Module, prefix: str):
        for mod_name, sub in module.named_modules(remove_duplicate=False):
            for kind in ("_parameters", "_buffers"):
                table = sub.__dict__[kind]
                if not isinstance(table, SyncedDict):
                    table = SyncedDict(table, self)
                    sub.__dict__[kind] = table
                for key, tensor in dict.items(table):
                    if tensor is None:
                        continue
                    full = ".".join(p for p in (prefix, mod_name, key) if p)
                    self.add(full, tensor, (id(table), key))
                    table.slot_keys.add(key)

    def replace(self, table, key, tensor):
        """A module attribute was re-assigned: the slot now holds the new tensor."""
        for i, slot in enumerate(self.slots):
            if (id(table), key) in slot.locations:
                self._retarget(i, tensor)
                return

    # synchronisation ---------------------------------------------------------------
    def sync_to_host(self):
        """Copy device values into the torch tensors, if a step changed them."""
        if not self.device_newer or self.capturing:
            return
        self.device_newer = False
        for slot, array in zip(self.slots, self.arrays):
            if array is None:
                continue
            with torch.no_grad():
                slot.tensor.copy_(jax_to_tensor(array, slot.tensor.dtype))
            slot.version = slot.tensor._version

    def device_arrays(self) -> list:
        """The state as device arrays, uploading tensors changed on the torch side."""
        for i, slot in enumerate(self.slots):
            if self.arrays[i] is None or slot.tensor._version != slot.version:
                if self.device_newer and self.arrays[i] is not None:
                    raise RuntimeError(
                        f"{slot.name} was changed in place on the torch side while newer values "
                        "from the device had not been read back; read the tensor (for example "
                        "through state_dict()) before modifying it")
                sharding = wafer.state_sharding(self.backend.mesh, tuple(slot.tensor.shape))
                self.arrays[i] = _to_device(slot.tensor, sharding)
                slot.version = slot.tensor._version
        return list(self.arrays)

    def update(self, arrays):
        self.arrays = list(arrays)
        self.device_newer = True


def _to_device(tensor, sharding):
    """A state tensor as a device array. A lazily created full tensor (`cstorch.zeros`,
    ...) that was never materialised is built on the device, never on the host."""
    from cstorch.storage.creation import DeferredFullTensor
    if isinstance(tensor, DeferredFullTensor) and tensor._value is None:
        return jnp.full(tuple(tensor.shape), tensor.fill_value, to_jax_dtype(tensor.dtype),
                        device=sharding)
    return jax.device_put(tensor_to_numpy(tensor), sharding)


class SyncedDict(dict):
    """A module's `_parameters`/`_buffers` table that brings values up to date on read."""

    def __init__(self, table, state: DeviceState):
        super().__init__(table)
        self.state = state
        self.slot_keys = set()

    def _sync(self):
        self.state.sync_to_host()

    def __getitem__(self, key):
        self._sync()
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._sync()
        return super().get(key, default)

    def items(self):
        self._sync()
        return super().items()

    def values(self):
        self._sync()
        return super().values()

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key in self.slot_keys and value is not None and not self.state.capturing:
            self.state.replace(self, key, value)

    def __reduce_ex__(self, protocol):
        return dict, (dict(super().items()),)
