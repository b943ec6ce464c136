"""`cerebras.pytorch.utils.tensorboard`: write and read TensorBoard summaries.

:class:`SummaryWriter` is torch's writer plus :meth:`SummaryWriter.add_tensor`;
:class:`SummaryReader` reads scalars, tensors and text back from one or more log
directories. The files are the real package's:

- scalars and text go to torch's ``events.out.tfevents.<suffix>`` file (legacy
  ``simple_value`` scalars; text under the tag ``<name>/text_summary``, plugin ``text``);
- each ``add_tensor`` call is one ``torch.save``'d dict ``{"step", "ns_since_epoch",
  "tensor"}`` at ``events.out.csevents.<suffix>/tensors/<name>/<step>.<time>.pt``, beside a
  ``__metadata__`` file holding ``{"__version__": 1.1}``. Nothing about tensors is in the
  event file.
"""
import dataclasses
import datetime
import fnmatch
import glob
import json
import numbers
import os
import time

import numpy as np
import torch
from tensorboard.backend.event_processing import event_accumulator, io_wrapper
from tensorboard.backend.event_processing.event_accumulator import ScalarEvent, TensorEvent
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.plugins.scalar import metadata as _scalar_metadata
from tensorboard.util import tensor_util
from torch.utils.tensorboard import SummaryWriter as _TorchSummaryWriter

from cstorch.backend import current_backend_impl

__all__ = ["SummaryWriter", "SummaryReader"]

_CS_EVENTS_VERSION = 1.1
_METADATA_FILE = "__metadata__"
_TENSORS_DIR = "tensors"
# torch's add_text stores the text under this suffix.
_TEXT_TAG_SUFFIX = "/text_summary"
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"


def _validate_base_step(base_step) -> int:
    if isinstance(base_step, bool) or not isinstance(base_step, numbers.Integral):
        raise TypeError(
            f"base_step must be a non-negative int, got {type(base_step).__name__} "
            f"{base_step!r}"
        )
    if base_step < 0:
        raise ValueError(f"base_step must be a non-negative int, got {base_step}")
    return int(base_step)


def _tensor_parts(name) -> list[str]:
    """The folders of ``name`` under ``tensors/``; refuses names that would leave it."""
    if not isinstance(name, str):
        raise TypeError(f"add_tensor takes a str name, got {type(name).__name__}")
    parts = name.split("/")
    if not name or any(p in ("", ".", "..") or os.sep in p for p in parts):
        raise ValueError(
            f"add_tensor name {name!r} cannot be a path under tensors/: it needs non-empty "
            f"'/'-separated parts other than '.' and '..'"
        )
    return parts


def _as_tensor(tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        try:
            tensor = torch.as_tensor(np.asarray(tensor))
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(
                f"add_tensor takes a tensor, got {type(tensor).__name__}; use add_text for "
                f"strings"
            ) from e
    # clone: torch.save writes a view's whole storage, not just the view.
    return tensor.detach().cpu().clone()


def _main_process() -> bool:
    backend = current_backend_impl(raise_exception=False)
    return backend is None or backend.is_main_process


class _NoEvents:
    """The event writer of a process that does not write events."""

    def __init__(self, logdir):
        self._logdir = logdir

    def get_logdir(self):
        return self._logdir

    def __getattr__(self, name):   # add_event, add_summary, add_graph, flush, close, ...
        return lambda *args, **kwargs: None


class SummaryWriter(_TorchSummaryWriter):
    """Thin wrapper around ``torch.utils.tensorboard.SummaryWriter`` that can also save
    whole tensors (:meth:`add_tensor`).

    Passing a writer to :class:`cerebras.pytorch.utils.data.DataExecutor` makes the
    values given to :func:`cerebras.pytorch.summarize_scalar` and
    :func:`cerebras.pytorch.summarize_tensor` appear in it: a value summarized in the
    executor's step with zero-based index ``i`` (``executor.iteration``) is written at step
    ``writer.base_step + i``, so with the default ``base_step=1`` the first step is step 1.
    The ``add_*`` methods never add ``base_step`` themselves.

    Args:
        *args: Forwarded to ``torch.utils.tensorboard.SummaryWriter`` (``log_dir``,
            ``comment``, ``purge_step``, ``max_queue``, ``flush_secs``,
            ``filename_suffix``).
        base_step: The step of the first step in ``summarize_{scalar,tensor}``, e.g. the
            global step a run resumed from plus one. Must be an int >= 0.
        **kwargs: Forwarded to ``torch.utils.tensorboard.SummaryWriter``.

    Raises:
        TypeError: ``base_step`` is not an int.
        ValueError: ``base_step`` is negative.
    """

    def __init__(self, *args, base_step: int = 1, **kwargs):
        # Validated before torch's constructor runs so a bad value leaves no event
        # file or directory behind.
        self.base_step = base_step
        self._writes = _main_process()
        self._cs_events_dir = None
        self._last_ns = 0
        super().__init__(*args, **kwargs)

    def _get_file_writer(self):
        # In a multi-process run only the main process writes events; the others
        # accept every call and write nothing.
        if not self._writes:
            if self.file_writer is None:
                self.file_writer = _NoEvents(self.log_dir)
                self.all_writers = {self.log_dir: self.file_writer}
            return self.file_writer
        return super()._get_file_writer()

    @property
    def base_step(self) -> int:
        """The step that ``summarize_{scalar,tensor}`` values of the first step get."""
        return self._base_step

    @base_step.setter
    def base_step(self, value: int):
        self._base_step = _validate_base_step(value)

    @property
    def cs_events_dir(self) -> str:
        """The directory of this writer's tensors: ``events.out.csevents.<suffix>`` beside
        the event file ``events.out.tfevents.<suffix>``, created with its ``__metadata__``
        file on first use. (A process that writes no events gets the name only.)"""
        if self._cs_events_dir is None:
            if not self._writes:
                return os.path.join(str(self.log_dir), "events.out.csevents")
            event_file = os.path.basename(self._get_file_writer().event_writer._file_name)
            path = os.path.join(
                str(self.log_dir), event_file.replace("tfevents", "csevents", 1)
            )
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, _METADATA_FILE), "w") as f:
                json.dump({"__version__": _CS_EVENTS_VERSION}, f)
            self._cs_events_dir = path
        return self._cs_events_dir

    def add_tensor(self, name: str, tensor: torch.Tensor, step: int):
        """Save ``tensor`` (its dtype, shape and every element) as summary ``name`` at
        ``step``, for :meth:`SummaryReader.read_tensor`.

        Each call writes ``{"step": step, "ns_since_epoch": <time>, "tensor": tensor}``
        with ``torch.save`` to ``<cs_events_dir>/tensors/<name>/<step>.<time>.pt``;
        several calls at one step are all kept.

        Args:
            name: Name of the summary; ``"/"`` separates folders.
            tensor: A ``torch.Tensor`` (anything ``torch.as_tensor`` takes is converted).
            step: The step, an int.

        Raises:
            TypeError: ``step`` is not an int, or ``tensor`` is not numeric.
            ValueError: ``name`` is empty or is not a relative path of named parts.
        """
        parts = _tensor_parts(name)
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"add_tensor takes an int step, got {type(step).__name__} {step!r}")
        step = int(step)
        tensor = _as_tensor(tensor)
        if not self._writes:
            return
        # Distinct, increasing times: the file name holds microseconds, and the reader's
        # latest value at a step is the one with the largest time.
        ns = max(time.time_ns(), self._last_ns + 1000)
        self._last_ns = ns
        stamp = (datetime.datetime.fromtimestamp(ns // 10**9)
                 + datetime.timedelta(microseconds=ns % 10**9 // 1000)).strftime(_TIME_FORMAT)
        folder = os.path.join(self.cs_events_dir, _TENSORS_DIR, *parts)
        os.makedirs(folder, exist_ok=True)
        torch.save({"step": step, "ns_since_epoch": ns, "tensor": tensor},
                   os.path.join(folder, f"{step}.{stamp}.pt"))


@dataclasses.dataclass
class TensorDescriptor:
    """One value of a tensor summary, as returned by :meth:`SummaryReader.read_tensor`.

    Attributes:
        step: Step the value was written at.
        ns_since_epoch: Nanoseconds since the epoch at which it was written.
        tensor: The value, with the dtype, shape and elements that were written.
    """

    step: int
    ns_since_epoch: int
    tensor: torch.Tensor


def _event_files_under(log_dir) -> bool:
    for _, dirs, files in os.walk(log_dir):
        if any(io_wrapper.IsSummaryEventsFile(f) for f in files):
            return True
        if any(d.startswith("events.out.csevents") for d in dirs):
            return True
    return False


def _is_scalar_tensor(accumulator, tag) -> bool:
    try:
        metadata = accumulator.SummaryMetadata(tag)
    except KeyError:
        return False
    return metadata.plugin_data.plugin_name == _scalar_metadata.PLUGIN_NAME


class SummaryReader:
    """Reads the summaries saved by :class:`SummaryWriter`.

    Every directory under ``log_dirs`` holding event files is a run; a name is looked up
    in all runs, and what they hold under it is read together, in step order.

    Args:
        log_dirs: The directory, or list of directories, holding the event files.
        filter: If given, only scalar and tensor names in a group (the part before the
            first ``"/"``) that begins with this string are kept, i.e. names matching
            ``f"{filter}*/*"``; ``read_scalar`` and ``read_tensor`` then also take a name
            without its group (``"loss"`` for ``"train/loss"``).
        **kwargs: Forwarded to tensorboard's ``EventMultiplexer``. Unless
            ``size_guidance`` says otherwise, every scalar and tensor event is kept
            (TensorBoard's default would sample them down).

    Raises:
        RuntimeError: No event files are found under ``log_dirs``.

    The files are read on construction; :meth:`reload` reads what was written since.
    """

    def __init__(self, log_dirs: str, filter: str | None = None, **kwargs):  # pylint: disable=redefined-builtin
        if isinstance(log_dirs, (str, os.PathLike)):
            log_dirs = [log_dirs]
        elif not isinstance(log_dirs, (list, tuple)):
            raise TypeError(
                f"log_dirs must be a path or a list of paths, got {type(log_dirs).__name__}"
            )
        self._log_dirs = [os.fspath(d) for d in log_dirs]
        if not all(isinstance(d, str) for d in self._log_dirs):
            raise TypeError(f"log_dirs must be str paths, got {log_dirs!r}")
        if filter is not None and not isinstance(filter, str):
            raise TypeError(f"filter must be a str or None, got {type(filter).__name__}")
        self._filter = filter
        if not any(_event_files_under(d) for d in self._log_dirs):
            raise RuntimeError(f"No event files found under {self._log_dirs}")

        size_guidance = dict(event_accumulator.DEFAULT_SIZE_GUIDANCE)
        size_guidance[event_accumulator.SCALARS] = 0  # 0 keeps every event
        size_guidance[event_accumulator.TENSORS] = 0
        size_guidance.update(kwargs.pop("size_guidance", None) or {})
        self._multiplexer = EventMultiplexer(size_guidance=size_guidance, **kwargs)
        self._scalars: dict[str, list] = {}    # name -> [(run, is a tensor)]
        self._texts: dict[str, list] = {}      # tag -> [run]
        self._tensors: dict[str, list] = {}    # name -> [folder of .pt files]
        self.reload()

    def reload(self):
        """Reads what was written since the last load, including new runs and tensors."""
        for log_dir in self._log_dirs:
            # Runs are named by path: EventMultiplexer.AddRunsFromDirectory names them
            # relative to the directory given, so two log dirs would both be run ".".
            for run_dir in io_wrapper.GetLogdirSubdirectories(log_dir):
                run_dir = os.path.normpath(run_dir)
                self._multiplexer.AddRun(run_dir, name=run_dir)
        self._multiplexer.Reload()

        scalars, texts, tensors = {}, {}, {}
        for run in sorted(self._multiplexer.Runs()):
            accumulator = self._multiplexer.GetAccumulator(run)
            tags = accumulator.Tags()
            for tag in tags[event_accumulator.SCALARS]:
                scalars.setdefault(tag, []).append((run, False))
            for tag in tags[event_accumulator.TENSORS]:
                if _is_scalar_tensor(accumulator, tag):
                    scalars.setdefault(tag, []).append((run, True))
                elif tag.endswith(_TEXT_TAG_SUFFIX):
                    texts.setdefault(tag, []).append(run)
        for log_dir in self._log_dirs:
            for root, dirs, _ in os.walk(log_dir):
                for cs_dir in sorted(d for d in dirs if d.startswith("events.out.csevents")):
                    top = os.path.join(root, cs_dir, _TENSORS_DIR)
                    for folder, _, files in os.walk(top):
                        if any(f.endswith(".pt") for f in files):
                            name = os.path.relpath(folder, top).replace(os.sep, "/")
                            tensors.setdefault(name, []).append(folder)
        self._scalars = {k: v for k, v in scalars.items() if self._kept(k)}
        self._texts = texts
        self._tensors = {k: v for k, v in tensors.items() if self._kept(k)}

    def _kept(self, name) -> bool:
        return self._filter is None or fnmatch.fnmatchcase(
            name, glob.escape(self._filter) + "*/*")

    def _names(self, index, name) -> list[str]:
        """The names of ``index`` that ``name`` means: itself, a glob over the names, or
        with a filter also the name within its group."""
        if name in index:
            return [name]
        patterns = [name]
        if self._filter is not None:
            patterns.append(glob.escape(self._filter) + "*/" + name)
        return sorted(n for n in index if any(fnmatch.fnmatchcase(n, p) for p in patterns))

    def _scalar_events(self, name) -> list[ScalarEvent]:
        events = []
        for tag in self._names(self._scalars, name):
            for run, is_tensor in self._scalars[tag]:
                if not is_tensor:
                    events.extend(self._multiplexer.Scalars(run, tag))
                    continue
                events.extend(
                    ScalarEvent(wall_time=e.wall_time, step=e.step,
                                value=float(tensor_util.make_ndarray(e.tensor_proto).reshape(-1)[0]))
                    for e in self._multiplexer.Tensors(run, tag))
        return sorted(events, key=lambda e: e.step)

    def read_scalar(self, name: str, step: int = None) -> list[ScalarEvent] | ScalarEvent:
        """Returns the values of scalar ``name`` (a glob pattern such as ``"train/*"`` reads
        every scalar it matches).

        Args:
            name: The scalar's name.
            step: If given, only the value written at this step.

        Returns:
            Without ``step``, a list of tensorboard ``ScalarEvent(wall_time, step, value)``
            in step order, empty if there is no such scalar. With ``step``, the
            ``ScalarEvent`` written at that step (the last one written, if several).

        Raises:
            KeyError: ``step`` is given and nothing was written at it.
        """
        events = self._scalar_events(name)
        if step is None:
            return events
        at_step = [e for e in events if e.step == step]
        if not at_step:
            raise KeyError(f"Could not find scalar {name} at step {step}")
        return max(at_step, key=lambda e: e.wall_time)

    def Scalars(self, name: str) -> list[ScalarEvent]:  # pylint: disable=invalid-name
        """The values of scalar ``name``: :meth:`read_scalar` without a step."""
        return self.read_scalar(name)

    def read_tensor(self, name: str, step: int = None, latest_only: bool = True):
        """Returns the values of tensor summary ``name``.

        Args:
            name: The tensor's name (a glob pattern reads every tensor it matches).
            step: If given, only the values written at this step.
            latest_only: Of several values written at one step, return only the last one
                written; otherwise all of them, in the order written.

        Returns:
            ``None`` if nothing matches. Without ``step``, a dict from step (in step order)
            to a :class:`TensorDescriptor` ``(step, ns_since_epoch, tensor)``, or to a list
            of them if not ``latest_only``. With ``step``, that step's descriptor, or list
            of descriptors if not ``latest_only``.
        """
        files = []
        for tensor_name in self._names(self._tensors, name):
            for folder in self._tensors[tensor_name]:
                for f in os.listdir(folder):
                    if not f.endswith(".pt"):
                        continue
                    at = f.split(".", 1)[0]
                    if step is None or at == str(step):
                        files.append(os.path.join(folder, f))
        by_step: dict[int, list[TensorDescriptor]] = {}
        for path in files:
            content = torch.load(path, map_location="cpu", weights_only=True)
            descriptor = TensorDescriptor(int(content["step"]), int(content["ns_since_epoch"]),
                                          content["tensor"])
            by_step.setdefault(descriptor.step, []).append(descriptor)
        if not by_step:
            return None
        for descriptors in by_step.values():
            descriptors.sort(key=lambda d: d.ns_since_epoch)
        pick = (lambda ds: ds[-1]) if latest_only else (lambda ds: ds)
        if step is not None:
            return pick(by_step[step])
        return {s: pick(by_step[s]) for s in sorted(by_step)}

    def scalar_names(self) -> set[str]:
        """The names of all scalars (those the filter keeps)."""
        return set(self._scalars)

    def scalar_groups(self) -> set[str]:
        """The groups of the scalar names: the part before the first ``"/"``."""
        return {name.split("/", 1)[0] for name in self._scalars if "/" in name}

    def tensor_names(self) -> set[str]:
        """The names of all tensor summaries (those the filter keeps)."""
        return set(self._tensors)

    def text_summary_names(self) -> list[str]:
        """The sorted names of all text summaries, as given to ``add_text``."""
        return sorted(tag[: -len(_TEXT_TAG_SUFFIX)] for tag in self._texts)

    def read_text_summary(self, name: str, step: int = None) -> list[TensorEvent] | TensorEvent:
        """Returns the values of text summary ``name``.

        Args:
            name: The name given to ``add_text`` (the ``"/text_summary"`` suffix torch adds
                to the tag may be included).
            step: If given, only the value written at this step.

        Returns:
            Without ``step``, a list of tensorboard ``TensorEvent(wall_time, step,
            tensor_proto)`` in step order (empty if there is no such text summary); with
            ``step``, the one written at that step (the last one, if several).

        Raises:
            RuntimeError: ``step`` is given and nothing was written at it.
        """
        tag = name if name.endswith(_TEXT_TAG_SUFFIX) else name + _TEXT_TAG_SUFFIX
        events = []
        for run in self._texts.get(tag, []):
            events.extend(self._multiplexer.Tensors(run, tag))
        events.sort(key=lambda e: e.step)
        if step is None:
            return events
        at_step = [e for e in events if e.step == step]
        if not at_step:
            raise RuntimeError(f"Could not find text_summary {tag} at step {step}")
        return max(at_step, key=lambda e: e.wall_time)

    def Tags(self) -> dict[str, list[str]]:  # pylint: disable=invalid-name
        """The event files' tags of all runs together: ``{"scalars": [...], "tensors":
        [...]}``, sorted. Scalars stored as tensors and text tags are under ``"tensors"``;
        the tensors of :meth:`SummaryWriter.add_tensor` are not in the event files."""
        scalars, tensors = set(), set()
        for tags in self._multiplexer.Runs().values():
            scalars.update(tags[event_accumulator.SCALARS])
            tensors.update(tags[event_accumulator.TENSORS])
        return {"scalars": sorted(scalars), "tensors": sorted(tensors)}
