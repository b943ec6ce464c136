"""`DataExecutor`: one run over a dataloader, and the step counters of that run."""
import sys
from typing import Optional, Union

from tqdm.auto import tqdm

from cstorch.utils.data.dataloader import DataLoader

_current: Optional["DataExecutor"] = None


class DataExecutor:
    """Runs `num_steps` steps over `dataloader`, starting a new pass over it when one ends.
    Without `num_steps` it runs one pass, or one step on a compile-only or validate-only
    backend.

    `checkpoint_steps`: None (no checkpoints), an int ``n`` (every ``n``-th step and the last
    one), or a callable schedule taking the zero-based step index and returning whether
    to checkpoint after it. The `cs_config`, `writer`, `profiler_activities` and
    `micro_batch_size` arguments are accepted for compatibility and not used.

    While iterating, `cstorch.current_executor()` returns it: `iteration` is the zero-based
    index of the current step, `user_iteration` the one-based step number.
    """

    def __init__(self, dataloader, num_steps: Optional[int] = None,
                 checkpoint_steps: Optional[Union[int, object]] = None,
                 activation_steps: Optional[int] = None, cs_config=None, writer=None,
                 profiler_activities=None, micro_batch_size=None):
        if not isinstance(dataloader, DataLoader):
            raise TypeError("DataExecutor expects a cstorch.utils.data.DataLoader, got "
                            f"{type(dataloader).__name__}")
        for name, value in (("num_steps", num_steps), ("activation_steps", activation_steps)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if checkpoint_steps is not None and not callable(checkpoint_steps):
            if not isinstance(checkpoint_steps, int) or isinstance(checkpoint_steps, bool) \
                    or checkpoint_steps < 0:
                raise ValueError(f"checkpoint_steps must be None, a non-negative int or a schedule, "
                                 f"got {checkpoint_steps!r}")
        if num_steps is None:
            from cstorch.backend import current_backend_impl
            backend = current_backend_impl()
            if backend is not None and (backend.params.get("compile_only") or backend.params.get("validate_only")):
                num_steps = 1
        self.dataloader = dataloader
        self.num_steps = num_steps
        self.checkpoint_steps = checkpoint_steps
        self.activation_steps = activation_steps
        self.iteration = -1
        self._used = False

    @property
    def user_iteration(self) -> int:
        return self.iteration + 1

    def on_checkpoint_step(self) -> bool:
        cs = self.checkpoint_steps
        if cs is None or self.iteration < 0:
            return False
        if callable(cs):
            return bool(cs(self.iteration))
        step = self.user_iteration
        return (cs > 0 and step % cs == 0) or (self.num_steps is not None and step == self.num_steps)

    def __len__(self):
        return self.num_steps if self.num_steps is not None else len(self.dataloader)

    def __iter__(self):
        global _current
        if self._used:
            raise RuntimeError("a DataExecutor can be iterated only once; create a new one for "
                               "another run")
        self._used = True
        _current = self
        progress = tqdm(total=self.num_steps, desc="steps", unit="step",
                        disable=not sys.stderr.isatty())
        try:
            produced = 0
            while self.num_steps is None or produced < self.num_steps:
                empty = True
                for batch in self.dataloader:
                    empty = False
                    self.iteration = produced
                    yield batch
                    produced += 1
                    progress.update(1)
                    if self.num_steps is not None and produced >= self.num_steps:
                        break
                if empty:
                    raise RuntimeError("the dataloader produced no batches")
                if self.num_steps is None:
                    break
        finally:
            progress.close()
            _current = None


def current_executor() -> DataExecutor:
    """The DataExecutor being iterated; an error outside of one."""
    if _current is None:
        raise RuntimeError("no DataExecutor is running; current_executor() is only available "
                           "while iterating a cstorch.utils.data.DataExecutor")
    return _current


def is_checkpoint_step() -> bool:
    """Whether checkpoint closures run now: on checkpoint steps of the running executor,
    or always when no executor is running."""
    return True if _current is None else _current.on_checkpoint_step()
