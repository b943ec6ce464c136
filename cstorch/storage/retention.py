"""`max_checkpoints`: keep only the newest N checkpoints this process wrote."""
import os
import threading

from cstorch.run import current

_written: list = []
_lock = threading.Lock()


def _limit():
    backend = current.backend()
    return getattr(backend, "max_checkpoints", None) if backend is not None else None


def record(path: str):
    """Note a completed checkpoint, then delete the oldest ones beyond the limit."""
    path = os.path.abspath(path)
    with _lock:
        if path in _written:
            _written.remove(path)
        _written.append(path)
        limit = _limit()
        if not limit:
            return
        while len(_written) > limit:
            old = _written.pop(0)
            try:
                os.remove(old)
            except FileNotFoundError:
                pass


def written() -> list:
    """Paths recorded so far, oldest first."""
    with _lock:
        return list(_written)


def forget():
    """Drop the record (tests use it to start fresh)."""
    with _lock:
        _written.clear()
