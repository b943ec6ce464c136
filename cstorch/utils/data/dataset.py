"""`cstorch.utils.data.SyntheticDataset`: samples built on the fly from a nested spec."""
import operator
from collections import OrderedDict, defaultdict
from typing import Any, NamedTuple, Union
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

SampleSpecT = Union[
    torch.Tensor,
    Callable[[int], torch.Tensor],
    list["SampleSpecT"],
    tuple["SampleSpecT", ...],
    dict[str, "SampleSpecT"],
    "OrderedDict[str, SampleSpecT]",
    NamedTuple,
]


def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def _key_path(path: str, key) -> str:
    # Double quotes for string keys so the path reads like the user's own indexing code.
    return f'{path}["{key}"]' if isinstance(key, str) else f"{path}[{key!r}]"


def _count_leaves(spec, path: str) -> int:
    """Checks every node of ``spec`` and returns how many leaves it holds."""
    if isinstance(spec, torch.Tensor):
        return 1
    if isinstance(spec, dict):
        return sum(_count_leaves(v, _key_path(path, k)) for k, v in spec.items())
    if _is_namedtuple(spec):
        return sum(_count_leaves(v, f"{path}.{f}") for f, v in zip(type(spec)._fields, spec))
    if isinstance(spec, (list, tuple)):
        return sum(_count_leaves(v, f"{path}[{i}]") for i, v in enumerate(spec))
    if callable(spec):
        return 1
    raise TypeError(
        f"SyntheticDataset: {path} is a {type(spec).__name__}, but every leaf of the sample "
        f"spec must be a torch.Tensor (cloned for each sample) or a callable taking the "
        f"sample index and returning a torch.Tensor. Containers may be list, tuple, dict, "
        f"OrderedDict or NamedTuple; wrap constants with torch.tensor(...).")


def _build(spec, index: int, path: str):
    """Builds the sample at ``index`` with the same containers as ``spec``."""
    if isinstance(spec, torch.Tensor):
        # A clone, so a consumer that writes into its sample never alters the spec or
        # the samples handed out after it.
        return spec.clone()
    if isinstance(spec, dict):
        items = [(k, _build(v, index, _key_path(path, k))) for k, v in spec.items()]
        if isinstance(spec, defaultdict):
            return type(spec)(spec.default_factory, items)
        return type(spec)(items)
    if _is_namedtuple(spec):
        return type(spec)(*(_build(v, index, f"{path}.{f}")
                            for f, v in zip(type(spec)._fields, spec)))
    if isinstance(spec, (list, tuple)):
        values = [_build(v, index, f"{path}[{i}]") for i, v in enumerate(spec)]
        return type(spec)(values)
    value = spec(index)
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"SyntheticDataset: the callable at {path} returned a {type(value).__name__} "
            f"for sample index {index}; it must return a torch.Tensor. Convert the value "
            f"inside the callable, e.g. `lambda i: torch.tensor(...)`.")
    return value


class SyntheticDataset(Dataset):
    """A dataset whose samples are generated on the fly from a sample spec.

    Useful where only the dtypes and shapes of the inputs matter (compile and validate
    runs, dataloader benchmarks) and building a real dataset would be wasted work.

    Args:
        sample_spec: A leaf, or a nested structure of list, tuple, dict, OrderedDict and
            NamedTuple holding leaves. A leaf is either a ``torch.Tensor``, which is
            cloned into every sample, or a callable that is called with the sample index
            and must return a ``torch.Tensor``. Each sample has the same structure and
            container types as the spec (a NamedTuple stays that NamedTuple).
        num_samples: The number of samples in the dataset. ``None`` (the default) makes
            the dataset infinite.

    A finite dataset is a map-style dataset: ``len()`` works, indices run from
    ``-num_samples`` to ``num_samples - 1`` (negative indices count from the end and the
    callables receive the positive index), and ``shuffle``/samplers of
    ``torch.utils.data.DataLoader`` apply. An infinite dataset has no length, so it is an
    ``IterableDataset`` (still a ``SyntheticDataset``) that yields samples 0, 1, 2, ...
    forever and can also be indexed by any non-negative index. The DataLoader refuses
    ``shuffle`` and samplers for it.

    Raises:
        TypeError: a leaf is neither a tensor nor a callable (the message names its path,
            e.g. ``sample_spec["x"][1]``), or ``num_samples`` is not an int. A callable
            that returns a non-tensor raises TypeError when that sample is built.
        ValueError: ``num_samples`` is negative, or the spec holds no leaves.
    """

    def __new__(cls, *args, **kwargs):
        # torch.utils.data.DataLoader cannot iterate a map-style dataset without a length:
        # its default SequentialSampler calls len(). An infinite dataset therefore has to
        # be an IterableDataset, while a finite one stays map-style so that shuffling,
        # samplers and len() keep working. Only a construction dispatches: unpickling (as
        # spawned DataLoader workers do) calls __new__ with the pickled class and no
        # arguments, and must keep that class.
        if cls is SyntheticDataset and (args or kwargs):
            num_samples = args[1] if len(args) > 1 else kwargs.get("num_samples")
            if num_samples is None:
                cls = _InfiniteSyntheticDataset
        return super().__new__(cls)

    def __init__(self, sample_spec: SampleSpecT, num_samples: int | None = None):
        if num_samples is not None:
            if isinstance(num_samples, bool):
                raise TypeError(f"SyntheticDataset: num_samples must be a non-negative int "
                                f"or None (infinite), got the bool {num_samples}")
            try:
                num_samples = operator.index(num_samples)
            except TypeError:
                raise TypeError(
                    f"SyntheticDataset: num_samples must be a non-negative int or None "
                    f"(infinite), got {type(num_samples).__name__} {num_samples!r}") from None
            if num_samples < 0:
                raise ValueError(f"SyntheticDataset: num_samples must be a non-negative int "
                                 f"or None (infinite), got {num_samples}")
        if _count_leaves(sample_spec, "sample_spec") == 0:
            raise ValueError(
                f"SyntheticDataset: the sample spec {sample_spec!r} holds no tensors or "
                f"callables, so every sample would be empty. Give at least one leaf, e.g. "
                f"{{'x': torch.zeros(3)}}.")
        self.sample_spec = sample_spec
        self.num_samples = num_samples

    def __len__(self) -> int:
        if self.num_samples is None:
            raise TypeError("SyntheticDataset: an infinite dataset (num_samples=None) has "
                            "no length; pass num_samples to give it one")
        return self.num_samples

    def _resolve(self, index) -> int:
        if isinstance(index, bool):
            raise TypeError("SyntheticDataset indices must be integers, not bool")
        try:
            index = operator.index(index)
        except TypeError:
            raise TypeError(f"SyntheticDataset indices must be integers, not "
                            f"{type(index).__name__}") from None
        if self.num_samples is None:
            if index < 0:
                raise IndexError(f"SyntheticDataset: index {index} is negative, but an "
                                 f"infinite dataset has no end to count back from")
            return index
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"SyntheticDataset: index {index} is out of range for a "
                             f"dataset of {self.num_samples} samples")
        return index % self.num_samples if index < 0 else index

    def __getitem__(self, index: int):
        index = self._resolve(index)
        return _build(self.sample_spec, index, "sample_spec")

    def __repr__(self) -> str:
        size = "infinite" if self.num_samples is None else f"num_samples={self.num_samples}"
        return f"SyntheticDataset({size})"


class _InfiniteSyntheticDataset(SyntheticDataset, IterableDataset):
    """The form `SyntheticDataset` takes when ``num_samples`` is None."""

    def __iter__(self) -> Iterator[Any]:
        # Each DataLoader worker runs its own copy of this iterator; striding by the number
        # of workers gives every worker distinct sample indices instead of duplicates.
        info = get_worker_info()
        index, stride = (0, 1) if info is None else (info.id, info.num_workers)
        while True:
            yield _build(self.sample_spec, index, "sample_spec")
            index += stride
