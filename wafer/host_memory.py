"""Host memory for programs that XLA runs on the CPU: keep their buffers mapped.

Each execution of an XLA CPU program allocates its scratch buffer (the step's
intermediates: tens to hundreds of MB for a small transformer) and frees it when it ends;
its outputs are fresh buffers too. glibc's malloc serves an allocation above 32 MB, and
anything too large for a thread's own arena, with a new `mmap` and returns it with
`munmap`, so every step faults the whole scratch buffer in again, page by page, and the
kernel zeroes each page (docs/benchmarks.md has the measurements).

`keep_buffers_mapped()` asks glibc to serve every allocation from one heap that it does
not give back to the system below 2 GiB of free space at its top, so that a freed buffer
is reused by the next step. One heap means one arena, and a thread takes its arena at its
first allocation: a thread that allocated before the limit keeps an arena of its own, and
glibc then hands that arena, in turn with the main one, to threads started later, XLA's
among them. An arena other than the main one is made of 64 MB heaps that glibc unmaps as
soon as they are free, so a step whose buffers land there faults them in afresh (5 to 27
thousand pages a step for the transformer-lm benchmark, depending on which threads got
it). `one_arena()` therefore sets the limit alone, early: `cstorch` calls it when it is
imported, before a model's initialisation starts PyTorch's OpenMP threads.

This is a process-wide trade. XLA's compile threads share the one arena too and take
turns at its lock, so a small program's compile (tiny BERT's) takes 0.4-0.5 s longer than
with glibc's arenas: paid once per program, against page faults in every step
(docs/benchmarks.md). And the process keeps the memory it has freed, as a caching
allocator does. What it keeps for good would also hold the host copies of the state that
moved to the device (a model's parameters at compile, an optimizer's zeros when it is
made), under the training steps' own memory: a 153M-parameter GPT's training peaked at
1.2x eager PyTorch's. `release_freed_host_memory()` gives every whole free page back
(`malloc_trim`) once such a move freed enough to matter; the steps' buffers are mapped
again by the first step after it and stay mapped.

Kept buffers cost more than the steps' own peak: one heap serves buffers of every size and
lifetime, a request is served from any freed space it fits in before the heap grows, and
where the holes fall depends on which thread allocates first. A 153M-parameter GPT's
training (2.45 GB of weights, moments and gradients) peaked between 3.9 and 4.6 GB of
resident memory in four runs of one script, eager PyTorch's at 3.7 GB, with never
more than 3.2 GB allocated. So a run whose state reaches `LARGE_STATE_BYTES` trades the
other way (`fit_to_state`): every buffer of `OWN_MAPPING_BYTES` or more gets its own
mapping, returned to the system when it is freed, and its steps fault their buffers in
afresh, as eager PyTorch's do. For that to hold, the heap must not already hold large
freed space, which glibc would hand out first: the state is placed inside
`own_mappings()`, where large buffers are mapped whatever the run's size, so that the
host copies it frees leave no holes (docs/benchmarks.md has the measurements).

A user who sets any of glibc's malloc variables (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_MAX_`,
`MALLOC_TRIM_THRESHOLD_`, ..., or a `glibc.malloc.*` tunable in `GLIBC_TUNABLES`) keeps
their own settings and no function here changes anything.
"""
import contextlib
import ctypes
import os
import sys

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# The largest value mallopt takes (an int); free space beyond it at the heap's top is
# given back to the system.
_TRIM_THRESHOLD = 2**31 - 1

_USER_SETTINGS = ("MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_",
                  "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

# glibc's default for M_MMAP_MAX: how many mappings it may hold at once.
_MMAP_MAX = 65536
# State from which memory outweighs the steps' page faults (see the module's docstring).
LARGE_STATE_BYTES = 1 << 30
# With a large state, buffers from this size on get their own mapping.
OWN_MAPPING_BYTES = 1 << 20

_applied: bool | None = None
_one_arena: bool | None = None
_own_mappings = False
_placing = False


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (musl and other C libraries lack it)
        return libc
    except (OSError, AttributeError):
        return None


def user_tuned_malloc(environ=os.environ) -> bool:
    """Whether the environment sets glibc's malloc: a `MALLOC_*` variable, or a
    `glibc.malloc.*` tunable in `GLIBC_TUNABLES` (its other tunables do not count)."""
    return (any(name in environ for name in _USER_SETTINGS)
            or "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""))


def one_arena() -> bool:
    """Limit glibc's malloc to its main arena for every thread that has not allocated yet
    (see the module's docstring), unless the user set glibc's malloc. Returns whether the
    limit is in force."""
    global _one_arena
    if _one_arena is None:
        libc = _glibc()
        _one_arena = bool(libc is not None and not user_tuned_malloc()
                          and libc.mallopt(_M_ARENA_MAX, 1))
    return _one_arena


def keep_buffers_mapped() -> bool:
    """Make glibc reuse freed buffers instead of unmapping them (see the module's
    docstring). Returns whether the settings are in force; the first call decides, later
    calls return its answer."""
    global _applied
    if _applied is None:
        libc = _glibc()
        if libc is None or user_tuned_malloc():
            _applied = False
        else:
            # One arena: a thread's own arena cannot hold a buffer above 64 MB, and then
            # glibc maps it whatever M_MMAP_MAX says.
            _applied = bool(one_arena()
                            and libc.mallopt(_M_MMAP_MAX, 0)
                            and libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    return _applied


def _map_large_buffers(on: bool):
    libc = _glibc()
    if on:
        # A threshold set by mallopt stays where it is put (glibc otherwise raises it to
        # the size of each mapped buffer freed, up to 32 MiB).
        libc.mallopt(_M_MMAP_THRESHOLD, OWN_MAPPING_BYTES)
    libc.mallopt(_M_MMAP_MAX, _MMAP_MAX if on else 0)


def fit_to_state(state_bytes: int) -> bool:
    """After the run's state changed to `state_bytes`: from `LARGE_STATE_BYTES` on, give
    each buffer of `OWN_MAPPING_BYTES` or more its own mapping, unmapped when it is freed;
    below, keep freed buffers for reuse again (see the module's docstring). Only where
    `keep_buffers_mapped` is in force. Returns whether buffers get their own mappings."""
    global _own_mappings
    large = bool(_applied) and state_bytes >= LARGE_STATE_BYTES
    if large != _own_mappings:
        _own_mappings = large
        if not _placing:
            _map_large_buffers(large)
    return _own_mappings


@contextlib.contextmanager
def own_mappings():
    """Inside, every buffer of `OWN_MAPPING_BYTES` or more gets its own mapping, whatever
    the run's size: for placing state, whose host copies are freed once the device holds
    it (see the module's docstring). After, as `fit_to_state` last decided."""
    global _placing
    if not _applied or _placing:
        yield
        return
    _placing = True
    _map_large_buffers(True)
    try:
        yield
    finally:
        _placing = False
        _map_large_buffers(_own_mappings)


# Below this many bytes moved to the device at once, what a trim gives back is not worth
# its walk over the heap.
TRIM_AFTER_BYTES = 64 << 20


def release_freed_host_memory(moved_bytes: int) -> bool:
    """After `moved_bytes` of host tensors were moved to the device and dropped: give the
    freed memory back to the system (see the module's docstring). Whether a trim ran."""
    libc = _glibc() if moved_bytes >= TRIM_AFTER_BYTES else None
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
