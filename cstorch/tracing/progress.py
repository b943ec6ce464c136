"""What a traced step's capture is doing, shown on a terminal while it runs.

A step's first call traces it, lowers it and has XLA compile it: seconds for a small model,
minutes for a large one, during which nothing else is printed. On a terminal a one-line
tqdm status names the step and the phase ("train_step: tracing", "train_step: lowering and
compiling") and is cleared when the capture ends; piped, nothing is shown.
"""
import contextlib
import contextvars
import sys

from tqdm.auto import tqdm

_current: contextvars.ContextVar = contextvars.ContextVar("capture_progress", default=None)


@contextlib.contextmanager
def shown(name: str):
    """Show the capture of step `name` inside the block, on a terminal only."""
    bar = tqdm(desc=name, bar_format="{desc}", leave=False, file=sys.stderr,
               disable=not sys.stderr.isatty())
    token = _current.set((bar, name))
    try:
        yield
    finally:
        _current.reset(token)
        bar.close()


def phase(what: str):
    """Name the phase the capture shown now has reached (nothing outside `shown`)."""
    current = _current.get()
    if current is not None:
        bar, name = current
        bar.set_description_str(f"{name}: {what}")
