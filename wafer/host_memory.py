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

This is a process-wide trade: the process keeps the memory it has freed, as a caching
allocator does. What it keeps for good would also hold the host copies of the state that
moved to the device (a model's parameters at compile, an optimizer's zeros when it is
made), under the training steps' own memory: a 153M-parameter GPT's training peaked at
1.2x eager PyTorch's. `release_freed_host_memory()` gives every whole free page back
(`malloc_trim`) once such a move freed enough to matter; the steps' buffers are mapped
again by the first step after it and stay mapped. A user who sets any of glibc's malloc variables (`MALLOC_ARENA_MAX`,
`MALLOC_MMAP_MAX_`, `MALLOC_TRIM_THRESHOLD_`, ..., or a `glibc.malloc.*` tunable in
`GLIBC_TUNABLES`) keeps their own settings and neither function changes anything.
"""
import ctypes
import os
import sys

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# The largest value mallopt takes (an int); free space beyond it at the heap's top is
# given back to the system.
_TRIM_THRESHOLD = 2**31 - 1

_USER_SETTINGS = ("MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST", "MALLOC_MMAP_MAX_",
                  "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

_applied: bool | None = None
_one_arena: bool | None = None


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
