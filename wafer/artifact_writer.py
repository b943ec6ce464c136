"""A step's artifacts written while its first call runs.

A compiled step's text artifacts (its captured graph, jaxpr, StableHLO and optimised HLO)
take a deep model's first step about a second of Python to format and write. Once the
step is dispatched, the host only waits for the device, so the files are written then,
on one thread. They are complete once `wait` returns: the caller waits before it reads a
value on the host, at the end of a data loop, and at exit; a program never dispatched
(a compile-only run) has its files written when the caller waits.
"""
import atexit
import threading

_queued: list = []     # writers of compiled steps not dispatched yet
_running: list = []    # the writing thread, at most one
_failures: list = []   # what a writer raised, reported by the next wait


def defer(write, what: str) -> None:
    """Run `write()` (no arguments, writes files) at the next `start` or `wait`; `what`
    names the files for the error a failure raises."""
    _queued.append((write, what))


def start() -> None:
    """Write the queued artifacts on a thread: a step was dispatched."""
    if not _queued:
        return
    _join()
    writers = list(_queued)
    _queued.clear()
    thread = threading.Thread(target=_write_all, args=(writers,), name="cstorch-artifacts")
    _running.append(thread)
    thread.start()


def wait() -> None:
    """Every queued or started artifact on disk. Raises, once, for the first writer that
    failed since the last wait."""
    if _running and _running[-1] is threading.current_thread():
        return   # a writer reading a value on the host: the caller waits for it
    if _queued:
        writers = list(_queued)
        _queued.clear()
        _write_all(writers)
    _join()
    if _failures:
        failure = _failures.pop(0)
        _failures.clear()
        raise failure


def _join():
    while _running:
        _running.pop().join()


def _write_all(writers):
    for write, what in writers:
        try:
            write()
        except Exception as e:   # raised by wait(), on the caller's thread
            failure = OSError(f"could not write {what}: {type(e).__name__}: {e}. The step "
                              f"itself ran; its artifacts are only for reading")
            failure.__cause__ = e
            _failures.append(failure)


atexit.register(wait)
