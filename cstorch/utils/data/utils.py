"""`cstorch.utils.data.utils`: the checkpoint `Schedule` and `infer_batch_size`."""
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional

import torch
import torch.utils._pytree as pytree


@dataclass
class Schedule:
    """A set of zero-indexed steps, the union of `ranges`.

    `DataExecutor(checkpoint_steps=Schedule([...]))` takes a checkpoint after every step
    whose zero-based index is in the schedule.
    """

    @dataclass
    class Range:
        """Steps ``start, start + step, ...`` below `end` (no end: without bound); with
        `include_last`, also ``end - 1``, the range's last step."""
        start: int
        end: Optional[int] = None
        step: int = 1
        include_last: bool = False

        def __post_init__(self):
            for name in ("start", "end", "step"):
                value = getattr(self, name)
                if value is None and name == "end":
                    continue
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ValueError(f"Schedule.Range {name} must be a non-negative int, got {value!r}")
            if self.step < 1:
                raise ValueError(f"Schedule.Range step must be a positive int, got {self.step}")
            if self.end is None and self.include_last:
                raise ValueError("Schedule.Range include_last needs an end")

        def __contains__(self, index: int) -> bool:
            if self.include_last and self.end is not None and index == self.end - 1 \
                    and index >= self.start:
                return True
            return (index >= self.start and (self.end is None or index < self.end)
                    and (index - self.start) % self.step == 0)

        def __iter__(self) -> Iterator[int]:
            index = self.start
            while self.end is None or index < self.end:
                yield index
                index += self.step
            last = (self.end or 0) - 1
            if self.include_last and last >= self.start and (last - self.start) % self.step:
                yield last

        def range(self) -> range:
            """The regular steps ``start, start + step, ...`` below `end` as a `range`,
            without the `include_last` step. Needs an end."""
            if self.end is None:
                raise TypeError("Schedule.Range.range() needs an end")
            return range(self.start, self.end, self.step)

        def __len__(self) -> int:
            """How many steps the range holds, the `include_last` step included. Needs an
            end."""
            if self.end is None:
                raise TypeError("an unbounded Schedule.Range has no length")
            regular = self.range()
            last = self.end - 1
            extra = self.include_last and last >= self.start and (last - self.start) % self.step
            return len(regular) + (1 if extra else 0)

        def next_immediate_step(self, index: int) -> int:
            """The first step of the progression ``start, start + step, ...`` at or after
            `index` (the end is not considered): where a copy of the range starts to hold
            only the steps still to come."""
            if index <= self.start:
                return self.start
            return self.start + -(-(index - self.start) // self.step) * self.step

    ranges: List[Range] = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.ranges, Schedule.Range):
            self.ranges = [self.ranges]
        self.ranges = list(self.ranges)
        for r in self.ranges:
            if not isinstance(r, Schedule.Range):
                raise TypeError(f"a Schedule holds Schedule.Range objects, got {type(r).__name__}")

    def __contains__(self, index: int) -> bool:
        return any(index in r for r in self.ranges)

    def __iter__(self) -> Iterator[int]:
        """The steps in increasing order, each once (unbounded ranges make it endless)."""
        iterators = [iter(r) for r in self.ranges]
        heads = [next(it, None) for it in iterators]
        last = None
        while any(h is not None for h in heads):
            i = min(range(len(heads)), key=lambda k: math.inf if heads[k] is None else heads[k])
            value = heads[i]
            heads[i] = next(iterators[i], None)
            if value != last:
                yield value
                last = value

    def steps_below(self, end: int) -> List[int]:
        """The schedule's steps in ``[0, end)``."""
        out = []
        for index in self:
            if index >= end:
                break
            out.append(index)
        return out


def infer_batch_size(data: Any) -> Optional[int]:
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
