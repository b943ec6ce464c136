"""`cerebras.pytorch.utils.call_once`."""
import functools
import threading

__all__ = ["call_once"]


def call_once(reset_on_error: bool = True):
    """A decorator factory: the decorated function runs on its first call only; every
    later call returns what the first returned, without running it::

        @call_once()
        def setup_logging():
            ...

    If the first call raises, the next call tries again (with `reset_on_error`, the
    default); otherwise later calls raise the same error. Safe to call from several
    threads. The wrapper's `reset()` makes the next call run the function again.
    """
    if callable(reset_on_error) and not isinstance(reset_on_error, bool):
        raise TypeError("call_once is a decorator factory: write @call_once(), not @call_once")

    def decorate(fn):
        lock = threading.Lock()
        state = {}

        @functools.wraps(fn)
        def once(*args, **kwargs):
            with lock:
                if "result" in state:
                    return state["result"]
                if "error" in state:
                    raise state["error"]
                try:
                    state["result"] = fn(*args, **kwargs)
                except BaseException as e:
                    if not reset_on_error:
                        state["error"] = e
                    raise
                return state["result"]

        once.reset = state.clear
        return once

    return decorate
