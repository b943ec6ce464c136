"""`cstorch.utils.data.utils`: the checkpoint `Schedule` and `infer_batch_size`."""
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterator

import torch
import torch.utils._pytree as pytree

# The class's public path, as error messages name it.
_RANGE_PATH = "cerebras.pytorch.utils.data.utils.Schedule.Range"


@dataclass
class Schedule:
    """A set of zero-indexed steps: the union of non-overlapping `intervals`, each a
    `Schedule.Range`, sorted by start.

    `DataExecutor(checkpoint_steps=Schedule([...]))` takes a checkpoint after every step
    whose zero-based index the schedule holds.
    """

    @dataclass
    class Range:
        """The steps ``start, start + step, ...`` below `end`; with `include_last`, also
        ``end - 1``, the last step before `end`."""
        start: int
        end: int
        step: int
        include_last: bool

        def __post_init__(self):
            if not _is_int(self.start) or self.start < 0:
                raise ValueError(f"start ({self.start}) must an integer >= 0.")
            if not _is_int(self.end) or self.end <= self.start:
                raise ValueError(f"end ({self.end}) must be an integer greater than start "
                                 f"{self.start}.")
            if not _is_int(self.step) or self.step <= 0:
                raise ValueError(f"step ({self.step}) must be an integer greater than zero.")
            if not isinstance(self.include_last, bool):
                raise ValueError(f"include_last must be a bool, got {type(self.include_last)}")

        def range(self) -> range:
            """The regular steps ``start, start + step, ...`` below `end`, without the
            `include_last` step."""
            return range(self.start, self.end, self.step)

        def _extra(self) -> bool:
            """Whether `include_last` adds ``end - 1`` to the regular steps."""
            return self.include_last and (self.end - 1 - self.start) % self.step != 0

        def __iter__(self) -> Iterator[int]:
            yield from self.range()
            if self._extra():
                yield self.end - 1

        def __len__(self) -> int:
            return len(self.range()) + self._extra()

        @property
        def final_step(self) -> int:
            """The range's last step."""
            return self.end - 1 if self._extra() else self.range()[-1]

        def match(self, step: int) -> bool:
            """Whether the range holds `step`."""
            return step in self.range() or (self._extra() and step == self.end - 1)

        def next_immediate_step(self, target: int) -> int:
            """The first step of the range at or after `target`; a ValueError past
            `final_step`."""
            final = self.final_step
            if target > final:
                raise ValueError(f"Target {target} exceeds the last interval step {final}")
            if target <= self.start:
                return self.start
            regular = self.start + -(-(target - self.start) // self.step) * self.step
            return regular if regular < self.end else final

    intervals: list[Range]

    def __post_init__(self):
        for interval in self.intervals:
            if not isinstance(interval, Schedule.Range):
                raise ValueError(f"interval must of type <class '{_RANGE_PATH}'>")
        for before, after in zip(self.intervals, self.intervals[1:]):
            if after.start < before.end:
                raise ValueError(f"Intervals must be non-overlapping ranges, but got "
                                 f"{self.intervals}.")

    def range(self) -> tuple[range, ...]:
        """Each interval's regular steps as a Python `range`."""
        return tuple(interval.range() for interval in self.intervals)

    def __iter__(self) -> Iterator[int]:
        """The steps in increasing order."""
        for interval in self.intervals:
            yield from interval

    def __len__(self) -> int:
        return sum(len(interval) for interval in self.intervals)

    @property
    def start(self) -> int | None:
        """The first step (None for an empty schedule)."""
        return self.intervals[0].start if self.intervals else None

    @property
    def final_step(self) -> int | None:
        """The last step (None for an empty schedule)."""
        return self.intervals[-1].final_step if self.intervals else None

    def match(self, step: int) -> bool:
        """Whether the schedule holds `step`."""
        return any(interval.match(step) for interval in self.intervals)

    def next_immediate_step(self, target: int) -> int | None:
        """The first step at or after `target` (None for an empty schedule); a ValueError
        past `final_step`."""
        if not self.intervals:
            return None
        for interval in self.intervals:
            if target <= interval.final_step:
                return interval.next_immediate_step(target)
        raise ValueError(f"Target {target} exceeds the last interval step {self.final_step}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def infer_batch_size(data: Any) -> int | None:
    """The batch size of a (nested) batch: the first dimension of its first tensor that
    has one (in the structure's flattening order). None when no tensor has a dimension."""
    # A tensor, or a tuple, list or dict whose first entry is one: answered without walking
    # the whole structure (the executor asks once per step).
    first = data
    if type(first) in (tuple, list) and first:
        first = first[0]
    elif type(first) is dict and first:
        first = next(iter(first.values()))
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return first.shape[0]
    for leaf in pytree.tree_leaves(data):
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return leaf.shape[0]
    return None
