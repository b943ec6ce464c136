"""`cerebras.pytorch.utils.data.sampler`: a sampler that shards batches over streaming
workers in an order that does not depend on how many there are."""
from collections.abc import Iterator, Sized

import torch

from cstorch.utils.data.workers import active_worker

__all__ = ["DistributedSampler", "pad_index"]

pad_index = -1
"""The index a padded batch holds in place of the samples it lacks (`pad_last`): a
dataset's `__getitem__` returns a padding sample for it (`i == pad_index`)."""


class DistributedSampler(torch.utils.data.Sampler):
    """Shuffles, batches and shards a map-style dataset, deterministically and restartably.

    An epoch is a fixed sequence of batches, the same whatever the number of systems and
    streaming workers: the samples ``0 .. num_samples - 1`` (taken modulo the dataset's
    length, so `num_samples` larger than the dataset repeats it and smaller shrinks it),
    shuffled with a generator seeded by ``seed + epoch`` if `shuffle`, cut into batches of
    `batch_size`. The last, incomplete batch is dropped with `drop_last`, filled up with
    `pad_index` with `pad_last`, else kept short.

    With `shard` (default) and inside a CSX run's streaming worker
    (`cstorch.distributed.is_streamer()`), each worker yields only its share, so that
    the systems' batches of a step, joined, are consecutive batches of the epoch: step
    ``s`` of system ``c`` gets batch ``s * num_csx + c``, and a system's steps go to its
    workers in turn (step ``s`` to local worker ``s % num_workers_per_csx``), as the
    `DataLoader` takes them. `batch_size` is then the per-system batch size
    (`cstorch.distributed.get_streaming_batch_size`). Elsewhere (CPU and GPU runs) the
    sampler yields every batch.

    Use it as a `batch_sampler` of a `torch.utils.data.DataLoader` (or as a sampler with
    ``batch_size=None``, when it yields sample indices, sharded one by one).

    - `seed`: None means 0, so that every worker draws the same order.
    - `start_index`: samples of the first epoch to skip (as if streamed already).
    - `set_state(start_index)`: continue after that many samples were streamed over
      all workers (what `RestartableDataLoader.load_state_dict` passes), from the epoch
      and the batch that follow them. The order is exact across a restart; across epoch
      boundaries it follows the workers' turns when each epoch's batches split evenly
      over ``num_csx * num_workers_per_csx``.
    """

    def __init__(self, data_source: Sized, shuffle: bool = True, seed: int | None = None,
                 start_index: int = 0, shard: bool = True, batch_size: int | None = None,
                 drop_last: bool = True, num_samples: int | None = None,
                 pad_last: bool = False):
        try:
            dataset_len = len(data_source)
        except TypeError:
            raise TypeError(f"DistributedSampler needs a dataset with a length, got "
                            f"{type(data_source).__name__}") from None
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be None or a positive int, got {batch_size!r}")
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples < 0):
            raise ValueError(f"num_samples must be None or a non-negative int, got {num_samples!r}")
        if not isinstance(start_index, int) or start_index < 0:
            raise ValueError(f"start_index must be a non-negative int, got {start_index!r}")
        if num_samples and not dataset_len:
            raise ValueError("DistributedSampler: cannot draw num_samples from an empty dataset")
        self.data_source = data_source
        self.dataset_len = dataset_len
        self.shuffle = shuffle
        self.seed = 0 if seed is None else int(seed)
        self.shard = shard
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.pad_last = pad_last and not drop_last
        self.num_samples = dataset_len if num_samples is None else num_samples
        self.num_csx, self.workers_per_csx, self.wse_id, self.local_id = self._layout(shard)
        self.epoch = 0
        self._start = 0          # units (batches, or samples without batch_size) to skip
        self.set_state(start_index)

    @staticmethod
    def _layout(shard: bool):
        worker = active_worker() if shard else None
        if worker is None:
            return 1, 1, 0, 0
        return (worker.layout.num_csx, worker.layout.num_workers_per_csx, worker.wse_id,
                worker.local_id)

    # the epoch's global sequence ------------------------------------------------------------
    def _order(self, epoch: int) -> torch.Tensor:
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + epoch)
            order = torch.randperm(self.num_samples, generator=g)
        else:
            order = torch.arange(self.num_samples)
        return order % max(self.dataset_len, 1)

    @property
    def units_per_epoch(self) -> int:
        """Batches in an epoch over all workers (samples, without a batch size)."""
        if self.batch_size is None:
            return self.num_samples
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _mine(self, unit: int) -> bool:
        step, system = divmod(unit, self.num_csx)
        return system == self.wse_id and step % self.workers_per_csx == self.local_id

    def _batch(self, order: torch.Tensor, unit: int) -> int | list[int]:
        if self.batch_size is None:
            return int(order[unit])
        batch = order[unit * self.batch_size:(unit + 1) * self.batch_size].tolist()
        if self.pad_last and len(batch) < self.batch_size:
            batch += [pad_index] * (self.batch_size - len(batch))
        return batch

    def __iter__(self) -> Iterator[int | list[int]]:
        epoch, start = self.epoch, self._start
        self.epoch, self._start = epoch + 1, 0
        order = self._order(epoch)
        for unit in range(start, self.units_per_epoch):
            if self._mine(unit):
                yield self._batch(order, unit)

    def __len__(self) -> int:
        """Batches (or samples) this worker yields in the next epoch."""
        return sum(1 for unit in range(self._start, self.units_per_epoch) if self._mine(unit))

    # state -----------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next epoch number `epoch` (its shuffle uses ``seed + epoch``)."""
        self.epoch, self._start = int(epoch), 0

    def set_state(self, start_index: int) -> None:
        """Continue as if `start_index` samples (over all workers, counting padding) were
        streamed since the first epoch began."""
        if not isinstance(start_index, int) or start_index < 0:
            raise ValueError(f"start_index must be a non-negative int, got {start_index!r}")
        units = start_index if self.batch_size is None else start_index // self.batch_size
        per_epoch = self.units_per_epoch
        if per_epoch == 0:
            self.epoch, self._start = 0, 0
            return
        self.epoch, self._start = divmod(units, per_epoch)
