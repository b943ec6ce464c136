"""`cerebras.pytorch.utils.tensorboard`: write and read TensorBoard summaries.

:class:`SummaryWriter` is torch's writer plus :meth:`SummaryWriter.add_tensor`, which
records a whole tensor (not just a scalar) in the ordinary event file.
:class:`SummaryReader` reads scalars, tensors and text back from one or more log
directories through TensorBoard's own event-processing code.

Tensors written by ``add_tensor`` are TensorBoard tensor summaries whose
``SummaryMetadata.plugin_data.plugin_name`` is :data:`TENSOR_PLUGIN_NAME`
(``"cstorch_tensor"``), so any reader can tell them apart from scalars
(plugin ``"scalars"``) and text (plugin ``"text"``).
"""
import dataclasses
import fnmatch
import glob
import json
import numbers
import os
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from tensorboard.backend.event_processing import event_accumulator, io_wrapper
from tensorboard.backend.event_processing.event_accumulator import ScalarEvent
from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.scalar import metadata as _scalar_metadata
from tensorboard.plugins.text import metadata as _text_metadata
from tensorboard.util import tensor_util
from torch.utils.tensorboard import SummaryWriter as _TorchSummaryWriter

__all__ = [
    "SummaryWriter",
    "SummaryReader",
    "ScalarEvent",
    "TensorSummary",
    "TextSummary",
    "TENSOR_PLUGIN_NAME",
]

#: Plugin name stamped on every tensor summary written by :meth:`SummaryWriter.add_tensor`.
TENSOR_PLUGIN_NAME = "cstorch_tensor"
# Bumped if the on-disk layout of these tensor summaries ever changes, so that readers
# can tell old files from new ones.
_TENSOR_PLUGIN_VERSION = 1

_SCALARS_PLUGIN = _scalar_metadata.PLUGIN_NAME
_TEXT_PLUGIN = _text_metadata.PLUGIN_NAME
# torch's add_text stores the text under this suffix; readers see the tag the user gave.
_TEXT_TAG_SUFFIX = "/text_summary"

# Floating dtypes that numpy (and so TensorProto) represents natively.
_NUMPY_FLOAT_DTYPES = (torch.float16, torch.float32, torch.float64)


def _validate_base_step(base_step) -> int:
    if isinstance(base_step, bool) or not isinstance(base_step, numbers.Integral):
        raise TypeError(
            f"base_step must be a non-negative int, got {type(base_step).__name__} "
            f"{base_step!r}"
        )
    if base_step < 0:
        raise ValueError(f"base_step must be a non-negative int, got {base_step}")
    return int(base_step)


def _tensor_to_numpy(tensor) -> np.ndarray:
    if isinstance(tensor, torch.Tensor):
        tensor = tensor.detach()
        if tensor.is_floating_point() and tensor.dtype not in _NUMPY_FLOAT_DTYPES:
            # bfloat16 and the float8 types have no numpy/TensorProto dtype that
            # tensorboard's make_tensor_proto/make_ndarray understand; float32 holds
            # each of their values exactly, so widening loses nothing.
            tensor = tensor.float()
        if tensor.layout != torch.strided:
            tensor = tensor.to_dense()
        return tensor.cpu().resolve_conj().resolve_neg().numpy()

    array = np.asarray(tensor)
    if array.dtype.kind in "biufc":
        return array
    if array.dtype.kind == "V" and array.dtype.names is None:
        # ml_dtypes types (bfloat16 and friends, e.g. from a JAX array) are opaque to
        # TensorProto; they all widen exactly to float32, for the same reason as above.
        try:
            return array.astype(np.float32)
        except (TypeError, ValueError):
            pass
    raise TypeError(
        f"add_tensor expects a numeric or boolean tensor, got dtype {array.dtype}; "
        f"use add_text for strings"
    )


def _tensor_summary_metadata() -> summary_pb2.SummaryMetadata:
    content = json.dumps({"version": _TENSOR_PLUGIN_VERSION}).encode("utf-8")
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=TENSOR_PLUGIN_NAME, content=content
        )
    )


def _main_process() -> bool:
    from cstorch.backend import current_backend_impl
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
    """``torch.utils.tensorboard.SummaryWriter`` that can also record whole tensors.

    Everything torch's writer offers (``add_scalar``, ``add_text``, ``add_histogram``,
    ...) works unchanged; :meth:`add_tensor` is added.

    Passing a writer to :class:`cerebras.pytorch.utils.data.DataExecutor` makes the
    values given to :func:`cerebras.pytorch.summarize_scalar` and
    :func:`cerebras.pytorch.summarize_tensor` appear in TensorBoard. The executor
    records a value summarized at executor step ``s`` at step ``writer.base_step + s``:
    it does the addition itself and calls :meth:`add_scalar` / :meth:`add_tensor` with
    the resulting ``global_step``. The ``add_*`` methods never add ``base_step``.

    Args:
        *args: Forwarded to ``torch.utils.tensorboard.SummaryWriter`` (``log_dir``,
            ``comment``, ``purge_step``, ``max_queue``, ``flush_secs``,
            ``filename_suffix``).
        base_step: Offset added by the executor to its step numbers when it writes
            ``summarize_{scalar,tensor}`` values, e.g. the global step a run resumed
            from. Must be an int >= 0.
        **kwargs: Forwarded to ``torch.utils.tensorboard.SummaryWriter``.

    Raises:
        TypeError: ``base_step`` is not an int.
        ValueError: ``base_step`` is negative.
    """

    def __init__(self, *args, base_step: int = 0, **kwargs):
        # Validated before torch's constructor runs so a bad value leaves no event
        # file or directory behind.
        self.base_step = base_step
        self._writes = _main_process()
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
        """The step offset the executor adds for ``summarize_{scalar,tensor}`` values."""
        return self._base_step

    @base_step.setter
    def base_step(self, value: int):
        self._base_step = _validate_base_step(value)

    @property
    def cs_events_dir(self) -> str:
        """Directory set aside next to the event file for Cerebras-specific artifacts.

        This implementation keeps tensor summaries in the regular event file, so
        nothing is written here; the directory exists (created on first access) for
        callers that link to it, such as the Model Zoo TensorBoard logger.
        """
        path = os.path.join(self.get_logdir(), "cs_events")
        os.makedirs(path, exist_ok=True)
        return path

    def add_tensor(self, tag: str, tensor, global_step=None, walltime=None):
        """Record the full contents of ``tensor`` under ``tag``.

        The tensor is stored as a TensorBoard tensor summary (a ``TensorProto`` with
        its shape and every element) whose plugin name is :data:`TENSOR_PLUGIN_NAME`.
        :meth:`SummaryReader.read_tensor` returns it as a torch tensor.

        Args:
            tag: Name of the summary.
            tensor: A ``torch.Tensor`` or anything ``numpy.asarray`` accepts, of any
                shape, with a boolean, integer, floating or complex dtype. bfloat16
                and float8 values are stored (and read back) as float32, which
                represents each of them exactly.
            global_step: Step to record the value at.
            walltime: Seconds since the epoch to record instead of the current time.

        Raises:
            TypeError: ``tensor`` has a non-numeric dtype (e.g. strings).
        """
        value = summary_pb2.Summary.Value(
            tag=tag,
            tensor=tensor_util.make_tensor_proto(_tensor_to_numpy(tensor)),
            metadata=_tensor_summary_metadata(),
        )
        self._get_file_writer().add_summary(
            summary_pb2.Summary(value=[value]), global_step, walltime
        )


@dataclasses.dataclass(frozen=True)
class TensorSummary:
    """One value of a tensor summary, as returned by :meth:`SummaryReader.read_tensor`.

    Attributes:
        wall_time: Seconds since the epoch at which the value was written.
        step: Step the value was written at.
        tensor: The value, with the shape and elements that were written.
    """

    wall_time: float
    step: int
    tensor: torch.Tensor


@dataclasses.dataclass(frozen=True)
class TextSummary:
    """One value of a text summary, as returned by :meth:`SummaryReader.read_text_summary`.

    Attributes:
        wall_time: Seconds since the epoch at which the value was written.
        step: Step the value was written at.
        text: The text; a (nested) list of strings if a multi-element string tensor
            was written.
    """

    wall_time: float
    step: int
    text: Union[str, list]


def _plugin_name(accumulator, tag) -> str:
    try:
        return accumulator.SummaryMetadata(tag).plugin_data.plugin_name
    except KeyError:
        return ""


def _proto_to_torch(proto) -> torch.Tensor:
    # make_ndarray may hand back a read-only view of the protobuf's bytes, which torch
    # refuses to wrap without a warning; copying makes it an ordinary owned tensor.
    return torch.from_numpy(np.array(tensor_util.make_ndarray(proto), copy=True))


def _proto_to_text(proto) -> Union[str, list]:
    array = tensor_util.make_ndarray(proto)
    decode = np.vectorize(
        lambda s: s.decode("utf-8") if isinstance(s, bytes) else str(s), otypes=[object]
    )
    texts = decode(array) if array.size else array.astype(object)
    return texts.reshape(-1)[0] if texts.size == 1 else texts.tolist()


class SummaryReader:
    """Reads the summaries written by :class:`SummaryWriter` (or any TensorBoard writer).

    Every directory under ``log_dirs`` that holds event files is a *run* (so nested
    runs, such as the sub-directories torch's ``add_scalars`` creates, are found), named
    by its path. Names (tags) are looked up across all runs: reading a name returns the
    events of every run that has it, sorted by step. Use :meth:`Scalars` and
    :meth:`Tags` for per-run access.

    Scalars are found wherever TensorBoard keeps them: ``simple_value`` summaries (what
    torch's ``add_scalar`` writes by default) and tensor summaries of the ``"scalars"``
    plugin (``add_scalar(..., new_style=True)`` and recent TensorBoard writers). Tensor
    names are those of :meth:`SummaryWriter.add_tensor` summaries and of tensor
    summaries without a plugin; scalars, text and other plugins' data are not tensor
    names.

    Args:
        log_dirs: A directory, or a list of directories, to read event files from.
            A directory that does not exist (yet) is allowed; :meth:`reload` picks it
            up once it has event files.
        filter: If given, only scalar and tensor names in a group (the part before the
            first ``"/"``) that starts with this string are kept, i.e. names matching
            ``f"{filter}*/*"``. Text summary names are not filtered.
        **kwargs: Forwarded to tensorboard's
            ``event_processing.event_multiplexer.EventMultiplexer``. Unless
            ``size_guidance`` says otherwise, every scalar and tensor event is kept
            (TensorBoard's default would sample them down).

    The event files are read once on construction; call :meth:`reload` to pick up
    what was written since.
    """

    def __init__(
        self,
        log_dirs: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
        filter: Optional[str] = None,  # pylint: disable=redefined-builtin
        **kwargs,
    ):
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

        size_guidance = dict(event_accumulator.DEFAULT_SIZE_GUIDANCE)
        size_guidance[event_accumulator.SCALARS] = 0  # 0 keeps every event
        size_guidance[event_accumulator.TENSORS] = 0
        size_guidance.update(kwargs.pop("size_guidance", None) or {})
        self._multiplexer = EventMultiplexer(size_guidance=size_guidance, **kwargs)

        # name -> [(run, stored tag)] for each kind; rebuilt by reload().
        self._scalars: Dict[str, list] = {}
        self._tensors: Dict[str, list] = {}
        self._texts: Dict[str, list] = {}
        self.reload()

    def reload(self) -> "SummaryReader":
        """Reads events written since the last load, including newly created runs."""
        for log_dir in self._log_dirs:
            # Same walk as EventMultiplexer.AddRunsFromDirectory, but naming each run by
            # its path: AddRunsFromDirectory names runs relative to the directory given,
            # so two log dirs holding event files directly would both be run ".".
            for run_dir in io_wrapper.GetLogdirSubdirectories(log_dir):
                run_dir = os.path.normpath(run_dir)
                self._multiplexer.AddRun(run_dir, name=run_dir)
        self._multiplexer.Reload()
        self._index()
        return self

    def _index(self):
        scalars, tensors, texts = {}, {}, {}
        for run in sorted(self._multiplexer.Runs()):
            accumulator = self._multiplexer.GetAccumulator(run)
            tags = accumulator.Tags()
            for tag in tags[event_accumulator.SCALARS]:
                scalars.setdefault(tag, []).append((run, tag))
            for tag in tags[event_accumulator.TENSORS]:
                plugin = _plugin_name(accumulator, tag)
                if plugin == _SCALARS_PLUGIN:
                    scalars.setdefault(tag, []).append((run, tag))
                elif plugin == _TEXT_PLUGIN:
                    name = tag
                    if tag.endswith(_TEXT_TAG_SUFFIX):
                        name = tag[: -len(_TEXT_TAG_SUFFIX)]
                    texts.setdefault(name, []).append((run, tag))
                elif plugin in ("", TENSOR_PLUGIN_NAME):
                    tensors.setdefault(tag, []).append((run, tag))
        if self._filter is not None:
            pattern = glob.escape(self._filter) + "*/*"
            scalars = {k: v for k, v in scalars.items() if fnmatch.fnmatchcase(k, pattern)}
            tensors = {k: v for k, v in tensors.items() if fnmatch.fnmatchcase(k, pattern)}
        # A run can hold a tag both as simple_value and as a scalars-plugin tensor.
        self._scalars = {k: sorted(set(v)) for k, v in scalars.items()}
        self._tensors = tensors
        self._texts = texts

    @staticmethod
    def _lookup(index, kind, name):
        if name not in index:
            available = ", ".join(repr(n) for n in sorted(index)) or "none"
            raise KeyError(f"No {kind} named {name!r}; available {kind} names: {available}")
        return index[name]

    @staticmethod
    def _at_step(events, step):
        events = sorted(events, key=lambda e: (e.step, e.wall_time))
        if step is None:
            return events
        return [e for e in events if e.step == step]

    def _run_scalars(self, run, tag) -> List[ScalarEvent]:
        accumulator = self._multiplexer.GetAccumulator(run)
        tags = accumulator.Tags()
        events = []
        if tag in tags[event_accumulator.SCALARS]:
            events.extend(accumulator.Scalars(tag))
        is_tensor = tag in tags[event_accumulator.TENSORS]
        if is_tensor and _plugin_name(accumulator, tag) == _SCALARS_PLUGIN:
            events.extend(
                ScalarEvent(
                    wall_time=e.wall_time,
                    step=e.step,
                    value=float(tensor_util.make_ndarray(e.tensor_proto).reshape(-1)[0]),
                )
                for e in accumulator.Tensors(tag)
            )
        return events

    def read_scalar(self, name: str, step: Optional[int] = None) -> List[ScalarEvent]:
        """Returns the values of scalar ``name``.

        Args:
            name: The scalar's tag.
            step: If given, only the values written at this step.

        Returns:
            A list of tensorboard ``ScalarEvent(wall_time, step, value)`` sorted by
            step (then wall time), from all runs that have ``name``. Empty if nothing
            was written at ``step``.

        Raises:
            KeyError: ``name`` is not a scalar name (the message lists those available).
        """
        events = []
        for run, tag in self._lookup(self._scalars, "scalar", name):
            events.extend(self._run_scalars(run, tag))
        return self._at_step(events, step)

    def Scalars(self, run: str, tag: str) -> List[ScalarEvent]:  # pylint: disable=invalid-name
        """The multiplexer's ``Scalars(run, tag)``, also covering scalars stored as tensors.

        Args:
            run: A run name, i.e. a key of :meth:`Tags`.
            tag: A scalar tag of that run (the filter does not apply here).

        Returns:
            The run's ``ScalarEvent`` list for ``tag``, in the order written.

        Raises:
            KeyError: Unknown run, or ``tag`` is not a scalar of ``run``.
        """
        events = self._run_scalars(run, tag)
        if not events:
            raise KeyError(f"Run {run!r} has no scalar named {tag!r}")
        return events

    def read_tensor(self, name: str, step: Optional[int] = None) -> List[TensorSummary]:
        """Returns the values of tensor summary ``name`` as torch tensors.

        Args:
            name: The tensor's tag.
            step: If given, only the values written at this step.

        Returns:
            A list of :class:`TensorSummary` ``(wall_time, step, tensor)`` sorted by
            step (then wall time), from all runs that have ``name``; each ``tensor``
            has the shape and values written (bfloat16/float8 come back as float32).
            Empty if nothing was written at ``step``.

        Raises:
            KeyError: ``name`` is not a tensor name (the message lists those available).
        """
        events = []
        for run, tag in self._lookup(self._tensors, "tensor", name):
            events.extend(
                TensorSummary(e.wall_time, e.step, _proto_to_torch(e.tensor_proto))
                for e in self._multiplexer.Tensors(run, tag)
            )
        return self._at_step(events, step)

    def scalar_names(self) -> List[str]:
        """Sorted names of all scalars (after the filter)."""
        return sorted(self._scalars)

    def scalar_groups(self) -> List[str]:
        """Sorted, distinct groups of the scalar names: the part before the first ``"/"``.

        Names without a ``"/"`` belong to no group.
        """
        return sorted({name.split("/", 1)[0] for name in self._scalars if "/" in name})

    def tensor_names(self) -> List[str]:
        """Sorted names of all tensor summaries (after the filter); no scalars or text."""
        return sorted(self._tensors)

    def text_summary_names(self) -> List[str]:
        """Sorted names of all text summaries, as given to ``add_text``."""
        return sorted(self._texts)

    def read_text_summary(self, name: str, step: Optional[int] = None) -> List[TextSummary]:
        """Returns the values of text summary ``name``.

        Args:
            name: The tag given to ``add_text``; the ``"/text_summary"`` suffix torch
                adds on disk may be included or left out.
            step: If given, only the values written at this step.

        Returns:
            A list of :class:`TextSummary` ``(wall_time, step, text)`` sorted by step
            (then wall time). Empty if nothing was written at ``step``.

        Raises:
            KeyError: ``name`` is not a text summary name (the message lists those
                available).
        """
        if name not in self._texts and name.endswith(_TEXT_TAG_SUFFIX):
            name = name[: -len(_TEXT_TAG_SUFFIX)]
        events = []
        for run, tag in self._lookup(self._texts, "text summary", name):
            events.extend(
                TextSummary(e.wall_time, e.step, _proto_to_text(e.tensor_proto))
                for e in self._multiplexer.Tensors(run, tag)
            )
        return self._at_step(events, step)

    def Tags(self) -> Dict[str, dict]:  # pylint: disable=invalid-name
        """The multiplexer's ``Runs()``: ``{run: {tag type: tags}}`` for every run.

        Tag types are TensorBoard's (``"scalars"``, ``"tensors"``, ``"histograms"``,
        ...). Unlike :meth:`scalar_names` and friends this is unfiltered and raw:
        scalars stored as tensors and text appear under ``"tensors"``.
        """
        return self._multiplexer.Runs()
