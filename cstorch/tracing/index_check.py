"""Out-of-range indices, checked inside the compiled step and reported on the host.

With the check on (`cstorch.backends.csx.debug.check_indices`; by default on for CPU and
GPU backends, off on CSX as on the wafer), a step's program also returns the smallest and
largest value each index argument took (`bridge.index_checks`). Reading those values
would wait for the step to finish, so they are read when the host waits anyway: before any
value on the device is read on the host (a loss printed, a checkpoint saved, a step
closure's arguments), at the end of a `DataExecutor`'s loop, and at a later call once
they are ready, or two calls on. A bad index raises an
`IndexError` naming the op, the step and the user's line; the step's results are in place
by then, as after a CUDA device-side assert.
"""
from collections import deque

import numpy as np

from bridge.device_tensor import host_read_hooks
from bridge.errors import IndexOutOfRangeError
from cstorch.backends import csx
from cstorch.utils.data.executor import loop_end_checks

# (bounds array, the program's checks, the step's name, its number); oldest first.
_pending: deque = deque()
# A step's bounds are read at the latest this many calls later, so the device always has
# a step queued while the host prepares the next.
_LAG = 2


def enabled(backend) -> bool:
    flag = csx.debug.check_indices
    return (not backend.is_csx) if flag is None else flag


def note(bounds, checks, name: str, number: int):
    """Hold a step's bounds until they are read."""
    if checks:
        _pending.append((bounds, checks, name, number))


def raise_pending(wait: bool = True):
    """Read the held bounds and raise for the first bad index. With `wait` False, read only
    those that are ready, and those of more than `_LAG` steps ago."""
    while _pending:
        bounds, checks, name, number = _pending[0]
        if not wait and len(_pending) <= _LAG and not bounds.is_ready():
            return
        _pending.popleft()
        for check, (smallest, largest) in zip(checks, np.asarray(bounds).tolist()):
            failure = check.failure(smallest, largest)
            if failure is not None:
                _pending.clear()
                raise IndexOutOfRangeError(
                    f"{failure}\n(step {number} of {name}; its results are in place. The "
                    f"check runs inside the compiled step: "
                    f"cstorch.backends.csx.debug.check_indices = False turns it off)")


def _before_host_read():
    if _pending:
        raise_pending()


host_read_hooks.append(_before_host_read)
loop_end_checks.append(raise_pending)
