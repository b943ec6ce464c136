"""`DataExecutor`: one run over a dataloader, and the step counters of that run."""
import logging
import math
import sys
import tempfile
import time
import warnings
from pathlib import Path

import jax
import torch
import torch.utils._pytree as pytree
from tqdm.auto import tqdm

import wafer
from bridge.convert import tensor_to_input
from bridge.device_tensor import DeviceTensor
from cstorch.backend import current_or_cpu_backend
from cstorch.backends import csx
from cstorch.run import current
from cstorch.run.capture_context import is_capturing
from cstorch.utils.data.dataloader import DataLoader
from cstorch.utils.data.utils import Schedule, infer_batch_size
from cstorch.utils.data.workers import Layout
from cstorch.utils.profiler import Profiler


log = logging.getLogger("cstorch")


def _deprecated(name, instead):
    warnings.warn(f"DataExecutor({name}=...) is deprecated; {instead}", FutureWarning, stacklevel=3)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Called when a loop has run all its steps: what the steps left to check on the host
# (cstorch.tracing.index_check) is raised there, before the loop is done.
loop_end_checks: list = []


class DataExecutor:
    """A single run of `num_steps` steps over `dataloader`.

    - `num_steps`: steps to run; without it, one pass (`len(dataloader)`), and a
      dataloader without a length needs it. A compile-only or validate-only backend, or
      one exploring micro-batch sizes (`micro_batch_size="explore"`), runs one step. When a
      pass ends before `num_steps`, the next pass begins.
    - `checkpoint_steps`: None or 0 (no checkpoints), an int ``n`` (every ``n``-th step
      and the last step), or a `Schedule` of zero-based step indices.
      `checkpoint_closure`s run on those steps.
    - `activation_steps`: the interval of steps at which a Cerebras system fetches
      activations (`run_context.is_activation_step`: every `activation_steps`-th step
      and the last one). It is lowered, with a logged warning, to the greatest common
      divisor of itself and every checkpoint step. On the CPU and GPU backends every
      step's values are at hand, so step closures and summaries run after every step
      whatever it is; on the CSX backend they run on activation steps only.
    - `profiler_activities`: `cstorch.utils.profiler.Activity` subclasses to run beside
      the samples and rates that `profiler.rate_tracker` always tracks.
    - `cs_config`, `writer`, `micro_batch_size` (keyword-only here; the reference documents
      them as deprecated, the real package no longer takes them): with a warning, still
      honoured: `cs_config` lays out the streaming workers when the CSX backend has no
      `cluster_config`, `writer` receives `summarize_scalar`/`summarize_tensor` values,
      `micro_batch_size` sets `cstorch.backends.csx.performance.micro_batch_size`.
    - `prefetch` (not in the reference; off by default): read the next step's batch as
      soon as a traced step has been dispatched, while it runs. On accelerators each
      batch's tensors are also uploaded to the backend's devices, laid out as a step's
      inputs are, and the loop gets device tensors (a step called with them is a capture
      apart from one called with host tensors). On the CPU, whose devices hold their
      arrays in host memory, the batch is read ahead but not uploaded: a step takes a host
      batch where it lies, and an upload there would be one more copy. The next batch is not
      read ahead on the last step, on a checkpoint step, nor at all for a dataloader that
      saves its position when no `checkpoint_steps` are given: a `dataloader.state_dict()`
      taken in the loop stays exact. A batch read ahead that the loop leaves unused
      (`break`) is the first batch of the next executor on that loader.

    Step closures and checkpoint closures called during a step (in a traced step or in
    the loop's body) run once the loop's body is done, before the next batch, in the
    order they were called; checkpoint closures called between the executor's creation
    and its loop run when the loop starts. Iterating the executor again runs `num_steps`
    more steps. While it runs, `cstorch.current_executor()` returns it: `iteration` is
    the zero-based index of the current step, `user_iteration` the one-based step number.
    """

    def __init__(self, dataloader: DataLoader, num_steps: int | None = None,
                 checkpoint_steps: int | Schedule | None = None,
                 activation_steps: int | None = None, profiler_activities=None, *,
                 cs_config=None, writer=None, micro_batch_size=None, prefetch: bool = False):
        if not isinstance(dataloader, DataLoader):
            raise TypeError("DataExecutor expects a cstorch.utils.data.DataLoader, got "
                            f"{type(dataloader).__name__}; wrap the loader: "
                            f"cstorch.utils.data.DataLoader(lambda: loader)")
        if num_steps is not None and (not _is_int(num_steps) or num_steps < 1):
            raise RuntimeError(f"Expected num_steps >= 1, but got {num_steps}.")
        if activation_steps is not None and (not _is_int(activation_steps)
                                             or activation_steps < 1):
            raise RuntimeError(f"Expected activation_steps to be an integer >= 1 or \"None\". "
                               f"Got: {activation_steps}")
        if checkpoint_steps is not None and not isinstance(checkpoint_steps, Schedule) and (
                not _is_int(checkpoint_steps) or checkpoint_steps < 0):
            raise ValueError(f"checkpoint_steps must be None, integer, or a Schedule, but got "
                             f"{checkpoint_steps}.")
        backend = current.backend()
        self.backend = backend

        if writer is not None:
            _deprecated("writer", "it still receives summarize_scalar and summarize_tensor values")
            if not callable(getattr(writer, "add_scalar", None)):
                raise TypeError(f"writer must be a cstorch.utils.tensorboard.SummaryWriter, got "
                                f"{type(writer).__name__}")
        self.writer = writer
        if micro_batch_size is not None:
            _deprecated("micro_batch_size",
                        "set cstorch.backends.csx.performance.micro_batch_size instead (done now)")
            csx.performance.micro_batch_size = micro_batch_size
        if cs_config is not None:
            _deprecated("cs_config", "pass cluster_config to cstorch.backend(\"CSX\", ...) instead")
            self._use_cs_config(cs_config, backend, dataloader)

        params = backend.params if backend is not None else {}
        if params.get("compile_only") or params.get("validate_only") or _exploring(backend):
            mode = ("compile_only" if params.get("compile_only") else
                    "validate_only" if params.get("validate_only") else
                    "exploring micro-batch sizes")
            if num_steps not in (None, 1):
                warnings.warn(f"the backend is {mode}: the executor runs 1 step, not {num_steps}",
                              stacklevel=2)
            num_steps = 1
        if num_steps is None:
            try:
                num_steps = len(dataloader)
            except TypeError as e:
                raise ValueError(f"num_steps is required: {e}, so the number of steps of a "
                                 f"pass is unknown") from None
            if num_steps == 0:
                raise RuntimeError("the dataloader has no batches (its length is 0); check the "
                                   "dataset's size against the batch size, and drop_last")
        self.dataloader = dataloader
        self.num_steps = num_steps
        self.checkpoint_steps = checkpoint_steps
        self.checkpoint_schedule = self._schedule(checkpoint_steps, num_steps)
        self.activation_steps = self._aligned(activation_steps)
        self.run_context = RunContext(self)
        self._profiler = Profiler(profiler_activities)
        self._index = -1   # the current step's zero-based index (`iteration`)
        # (closure, args, kwargs) called during the current step, run once its body is done;
        # before the loop, the checkpoint closures to run when it starts.
        self._closures: list = []
        current.set_upcoming_executor(self)
        self._artifact_dir: Path | None = None
        self.last_output: torch.Tensor | None = None
        self.prefetch = prefetch
        self._upload = None   # batch -> the batch on an accelerator, while prefetching
        self._reads_ahead = False
        self._keeps_output = False   # whether steps' scalar results are kept (progress bar)
        self._ahead = None    # (host batch, uploaded batch, samples) of the next step, or its error

    @staticmethod
    def _use_cs_config(cs_config, backend, dataloader):
        if backend is None or not backend.is_csx:
            return
        if backend.params.get("cluster_config") is not None:
            raise ValueError("both the CSX backend's cluster_config and DataExecutor(cs_config=...) "
                             "are given; keep only the backend's")
        systems = backend.mesh.shape["systems"]
        if cs_config.num_csx != systems:
            raise ValueError(
                f"cs_config.num_csx={cs_config.num_csx} but the backend's mesh has {systems} "
                f"system(s); pass cluster_config=CSConfig(num_csx=...) to cstorch.backend instead")
        dataloader.use_layout(Layout(cs_config.num_csx, cs_config.num_workers_per_csx))

    @staticmethod
    def _schedule(checkpoint_steps, num_steps) -> Schedule:
        """The zero-based checkpoint steps: an int ``n`` is every ``n``-th step and the last."""
        if isinstance(checkpoint_steps, Schedule):
            return checkpoint_steps
        if not checkpoint_steps:
            return Schedule([])
        every = min(checkpoint_steps, num_steps)
        return Schedule([Schedule.Range(every - 1, num_steps, every, True)])

    def _aligned(self, activation_steps) -> int:
        """`activation_steps` lowered to divide every checkpoint step (one-based)."""
        if activation_steps is None:
            return 1
        aligned = activation_steps
        for index in self.checkpoint_schedule:
            if index >= self.num_steps:
                break
            aligned = math.gcd(aligned, index + 1)
        if aligned != activation_steps:
            log.warning(
                f"Activation frequency was reduced from {activation_steps} to {aligned} because "
                f"of the checkpoint schedule. This is because some activations may be accessed "
                f"at any of the checkpoint steps {self.checkpoint_schedule.range()}. To avoid "
                f"the reduction make sure that activation steps are divisible by all "
                f"checkpoint steps.")
        return aligned

    @property
    def profiler(self) -> Profiler:
        """The run's profiler: `profiler.rate_tracker` (samples and rates) and the
        `profiler_activities`."""
        return self._profiler

    # Where the run is. Read inside a traced step, each is the value at the capture, built
    # into the program (`_read_while_capturing` warns).
    @property
    def iteration(self) -> int:
        """The zero-based index of the current step (-1 before the first)."""
        return _read_while_capturing("iteration", self._index)

    @property
    def user_iteration(self) -> int:
        """The one-based number of the current step."""
        return _read_while_capturing("user_iteration", self._index + 1)

    @property
    def on_final_iteration(self) -> bool:
        """Whether the current step is the run's last."""
        return _read_while_capturing("on_final_iteration", self._final())

    @property
    def is_initial_step(self) -> bool:
        """Whether the current step is the run's first."""
        return _read_while_capturing("is_initial_step", self._index == 0)

    def on_checkpoint_step(self) -> bool:
        return _read_while_capturing("on_checkpoint_step()", self._checkpoint_step())

    def on_activation_step(self) -> bool:
        """Whether this step is an activation step (see `activation_steps`)."""
        return _read_while_capturing("on_activation_step()", self._activation_step())

    def _final(self) -> bool:
        return self._index + 1 == self.num_steps

    def _checkpoint_step(self) -> bool:
        return self._index >= 0 and self.checkpoint_schedule.match(self._index)

    def _activation_step(self) -> bool:
        return (self._index + 1) % self.activation_steps == 0 or self._final()

    @property
    def artifact_dir(self) -> Path:
        """A directory for this run's artifacts, inside the backend's `artifact_dir`
        (on a process of a multi-process run that is not the main one, a temporary
        directory: only the main process writes into `artifact_dir`)."""
        if self._artifact_dir is None:
            backend = self.backend or current_or_cpu_backend()
            if not backend.is_main_process:
                self._artifact_dir = Path(tempfile.mkdtemp(prefix="cstorch_executor_"))
                return self._artifact_dir
            root = Path(backend.artifact_dir) / "executors"
            root.mkdir(parents=True, exist_ok=True)
            index = 1 + sum(1 for p in root.iterdir() if p.is_dir())
            while (root / str(index)).exists():
                index += 1
            self._artifact_dir = root / str(index)
            self._artifact_dir.mkdir()
        return self._artifact_dir

    def __len__(self):
        return self.num_steps

    def __iter__(self):
        if current.upcoming_executor() is self:
            current.set_upcoming_executor(None)
        # An executor run inside another's loop (an eval run between training steps)
        # hands `current_executor()` back to the outer one when it ends.
        outer = current.set_executor(self)
        self._index = -1
        progress = _Progress(self)
        self._keeps_output = not progress.bar.disable
        self._profiler.on_start(self.num_steps, self.backend is not None and self.backend.is_csx)
        try:
            self._run_closures()    # the checkpoint closures called before the loop
            self._start_prefetch()
            on_step = self._profiler.on_step
            shown = None if progress.bar.disable else progress.update
            for index in range(self.num_steps):
                batch, samples = self._next_batch()
                self._index = index
                try:
                    yield batch
                except GeneratorExit:   # `break`: the step's closures still run
                    self._run_closures()
                    raise
                self._run_closures()
                on_step(batch, samples)
                if shown is not None:
                    shown()
            for check in loop_end_checks:
                check()
            progress.finish()
        finally:
            self._closures.clear()
            if isinstance(self._ahead, tuple):   # left unused: the next executor's first batch
                self.dataloader.__dict__[_UNUSED] = self._ahead[0]
            self._ahead = None
            self._profiler.on_stop()
            progress.close()
            current.set_executor(outer)

    def queue_closure(self, fn, args=(), kwargs=None) -> None:
        """Run ``fn(*args, **kwargs)`` once the current step's loop body is done (before
        the loop, once it starts)."""
        self._closures.append((fn, args, kwargs or {}))

    def _run_closures(self):
        # A closure may call others: they run in this round too.
        while self._closures:
            fn, args, kwargs = self._closures.pop(0)
            fn(*args, **kwargs)

    # prefetching -------------------------------------------------------------------------
    def _start_prefetch(self):
        backend = self.backend or current.backend()
        if not self.prefetch:
            return
        if backend is None or not backend.executes or backend.distributed:
            why = ("no backend exists" if backend is None else
                   "the backend does not execute steps" if not backend.executes else
                   "a multi-process run assembles each global batch from the processes' parts")
            warnings.warn(f"DataExecutor(prefetch=True) has no effect here: {why}; batches are "
                          f"read when the loop asks for them", stacklevel=3)
            return
        if _uploads(backend.mesh):
            self._upload = _uploader(backend.mesh)
        first = self.dataloader.dataloader
        saves_position = self.dataloader.is_restartable or hasattr(first, "state_dict")
        self._reads_ahead = self.checkpoint_steps is not None or not saves_position

    def _next_batch(self):
        """(the next step's batch, its number of samples)"""
        ahead, self._ahead = self._ahead, None
        if isinstance(ahead, BaseException):
            raise ahead
        if ahead is not None:
            return ahead[1], ahead[2]
        batch = self.dataloader.__dict__.pop(_UNUSED, _UNUSED)
        if batch is _UNUSED:
            batch = self.dataloader.next_batch()
            samples = self.dataloader.last_samples   # counted once, by the worker
        else:
            samples = infer_batch_size(batch) or 0
        return self._uploaded(batch), samples

    def _uploaded(self, batch):
        """`batch` as the loop gets it: uploaded while prefetching to an accelerator."""
        return batch if self._upload is None else self._upload(batch)

    def _read_ahead(self):
        """Read and upload the next step's batch (called once a step was dispatched)."""
        if (self._ahead is not None or self._index < 0
                or self._index + 1 >= self.num_steps or self._checkpoint_step()):
            return
        self._ahead = _READING   # a step the loader itself runs reads nothing ahead
        try:
            batch = self.dataloader.next_batch()
            self._ahead = (batch, self._uploaded(batch), self.dataloader.last_samples)
        except Exception as e:  # raised where the loop asks for that batch
            self._ahead = e


_UNUSED = "_cstorch_executor_unused_batch"   # where a DataLoader keeps a batch left unused
_READING = object()


def _uploads(mesh) -> bool:
    """Whether a prefetching executor uploads batches to `mesh`'s devices: not to CPU
    devices, where `jax.device_put` from Python is a
    copy into memory that a step would read the host batch from as fast."""
    return mesh.devices.flat[0].platform != "cpu"


def _uploader(mesh):
    """batch -> the batch with every plain tensor on `mesh`'s devices as a step input is
    (split over the batch axes, in the dtype the step computes it in), as a `DeviceTensor`;
    other leaves stay as they are. One `jax.device_put` takes all of a batch's tensors, from
    the private host copies a step's inputs get (`tensor_to_input`)."""


    def upload(batch):
        leaves, spec = pytree.tree_flatten(batch)
        picked, hosts = [], []
        for i, t in enumerate(leaves):
            if type(t) is torch.Tensor and not t.requires_grad:
                try:
                    hosts.append(tensor_to_input(t))
                except TypeError:   # a dtype JAX has no equivalent of: left as it is
                    continue
                picked.append(i)
        if not picked:
            return batch
        arrays = jax.device_put(hosts, [wafer.batch_sharding(mesh, h.shape) for h in hosts])
        for i, array in zip(picked, arrays):
            t = leaves[i]
            leaves[i] = DeviceTensor.of(array, t.dtype, tuple(t.shape))
        return pytree.tree_unflatten(leaves, spec)

    return upload


class _Progress:
    """A tqdm bar of steps, rate and the last scalar a step returned, on a terminal only."""

    def __init__(self, executor: DataExecutor):
        self.executor = executor
        self.bar = tqdm(total=executor.num_steps, desc="steps", unit="step",
                        disable=not sys.stderr.isatty())
        self._shown = 0.0

    def update(self):
        if self.bar.disable:
            return
        now = time.monotonic()
        value = self.executor.last_output
        self.bar.update(1)
        # Reading the value waits for the step; once a second is cheap, and the value read
        # is drawn at once (tqdm's own redraws are timed and may skip it).
        if value is not None and now - self._shown > 1.0:
            self._shown = now
            self.bar.set_postfix(loss=f"{float(value):.4g}")

    def finish(self):
        """At the loop's end, the last step's value: the reads once a second may have
        skipped the last steps, and the bar stays on the terminal."""
        value = self.executor.last_output
        if not self.bar.disable and value is not None:
            self.bar.set_postfix(loss=f"{float(value):.4g}", refresh=False)

    def close(self):
        self.bar.close()


def _exploring(backend) -> bool:
    """Whether steps explore micro-batch sizes (and train nothing): one step tells all."""
    if backend is None or not backend.is_csx:
        return False
    mbs = csx.performance.micro_batch_size
    return mbs == "explore" or (isinstance(mbs, dict) and set(mbs) == {"explore"})


def _read_while_capturing(what: str, value):
    """`value`, with a warning when a step is being captured: the program would hold it."""
    if is_capturing():
        warnings.warn(
            f"cstorch.current_executor().{what} was read while a step was being captured: the "
            f"program holds the value it had then ({value!r}) and every later step computes "
            f"with it, where eager PyTorch would read it anew each step. Read it in a "
            f"@cstorch.step_closure, which runs after each step, or pass it to the step as a "
            f"tensor argument", stacklevel=3)
    return value


def current_executor() -> DataExecutor:
    """The DataExecutor being iterated; an error outside of one."""
    running = current.executor()
    if running is None:
        raise RuntimeError("no DataExecutor is running; current_executor() is only available "
                           "while iterating a cstorch.utils.data.DataExecutor")
    return running


def running_executor() -> DataExecutor | None:
    return current.executor()


def is_checkpoint_step() -> bool:
    """Whether checkpoint closures run now: on checkpoint steps of the running executor,
    or always when no executor is running."""
    running = current.executor()
    return True if running is None else running._checkpoint_step()


def is_activation_step() -> bool:
    """Whether the running executor's current step is an activation step (True when no
    executor is running)."""
    running = current.executor()
    return True if running is None else running._activation_step()


def runs_step_closures() -> bool:
    """Whether a traced step's step closures run after this step: always, except on the
    CSX backend off activation steps, where a Cerebras system fetches no values."""
    running = current.executor()
    if running is None or running.backend is None or not running.backend.is_csx:
        return True
    return running._activation_step()


def defer_step_closure(fn, args=(), kwargs=None) -> None:
    """Run a step closure once the running executor's loop body is done; with no executor
    running, now."""
    running = current.executor()
    if running is not None:
        running.queue_closure(fn, args, kwargs)
    else:
        fn(*args, **(kwargs or {}))


def defer_checkpoint_closure(fn, args=(), kwargs=None) -> None:
    """Run a checkpoint closure once the running executor's loop body is done, if this
    is a checkpoint step; before an executor's loop, when it starts; with no executor,
    an error (as in the real package: a checkpoint belongs to a run)."""
    running = current.executor()
    if running is not None:
        if running._checkpoint_step():
            running.queue_closure(fn, args, kwargs)
    elif current.upcoming_executor() is not None:
        current.upcoming_executor().queue_closure(fn, args, kwargs)
    else:
        raise RuntimeError("Cannot fetch a checkpoint outside of an execution context. Please "
                           "make all calls to any checkpoint closures inside the training loop.")


def note_step_output(results) -> None:
    """Keep a traced step's scalar result for the progress bar (read only when shown);
    called once a step has been dispatched, so a prefetching executor reads ahead here."""
    running = current.executor()
    if running is None:
        return
    if running._keeps_output:   # only a progress bar on a terminal shows it
        first = results[0] if isinstance(results, (tuple, list)) and results else results
        if isinstance(first, torch.Tensor) and first.dim() == 0 and first.is_floating_point():
            running.last_output = first
    if running._reads_ahead:
        running._read_ahead()


class RunContext:
    """What the real package's `executor.run_context` tells about the run: the checkpoint
    schedule, the effective `activation_steps` and where the current step stands."""

    def __init__(self, executor: DataExecutor):
        self._executor = executor

    @property
    def checkpoint_schedule(self) -> Schedule:
        return self._executor.checkpoint_schedule

    @property
    def activation_steps(self) -> int:
        return self._executor.activation_steps

    @property
    def num_steps(self) -> int:
        return self._executor.num_steps

    @property
    def is_checkpoint_step(self) -> bool:
        return self._executor._checkpoint_step()

    @property
    def is_activation_step(self) -> bool:
        return self._executor._activation_step()
