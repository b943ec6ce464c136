"""The one channel for information the project gives a user while it runs.

What a user should change is a warning (`warnings.warn`, at the user's line, filtered as
Python filters warnings). Information (a module registered by a step, what micro-batch
size `auto` chose, how long initialization took) goes through `inform`: a record of the
``cstorch.notices`` logger at INFO, which is shown on stderr as ``cstorch: <message>``
(on a line of its own: a progress line on the terminal is moved below it).
Silence it with ``logging.getLogger("cstorch.notices").setLevel(logging.WARNING)``.
Like the run core, this module imports nothing of `cstorch`.
"""
import logging
import sys

from tqdm.auto import tqdm

_logger = logging.getLogger("cstorch.notices")
_shown: set = set()


class _Stderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record is emitted (a redirected stream, a
    test's capture), not the stream that was current when the handler was made."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("cstorch: %(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass

    def emit(self, record):
        # A progress line on the terminal (a capture's phase, the executor's steps) is
        # cleared for the message and drawn again below it, not written over.
        with tqdm.external_write_mode(file=sys.stderr):
            super().emit(record)


_logger.addHandler(_Stderr())
_logger.setLevel(logging.INFO)
_logger.propagate = False


def inform(message: str, once: bool = False) -> None:
    """Tell the user `message` (with `once`, only the first time it is told)."""
    if once:
        if message in _shown:
            return
        _shown.add(message)
    _logger.info(message)
