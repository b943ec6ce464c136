"""Cut a captured training step where its gradients are complete, for micro-batching.

While `mark_gradients` is active, every `backward()` ends by passing the parameters'
gradients through `micro_batch_boundary`, an identity op, so the captured graph shows
where the gradients of one batch are complete. `split_at_gradients` cuts the graph there:

- the per-micro-batch part: what ran before the last `backward()` returned (forward,
  backward, buffer updates such as BatchNorm's running statistics), plus anything after
  it that reads the batch but not the gradients (a metric computed late);
- the once-per-step part: the rest (gradient clipping, the optimizer, the scheduler).

Every value that crosses from the first part to the second gets a mode saying how its
per-micro-batch values combine: "mean", "carry" (state threaded from one micro-batch to
the next, its final value), "concat" (per-sample values, joined back into the batch) or
"last". Running the parts and combining is the caller's business (`wafer.micro_batch`).
"""
from dataclasses import dataclass
from collections.abc import Iterable, Mapping, Sequence

import torch
import torch.fx as fx
from torch.optim.optimizer import register_optimizer_step_pre_hook

from bridge.errors import MicroBatchError
from bridge.ops.registry import lowering
from bridge.user_line import with_user_line


@torch.library.custom_op("bridge::micro_batch_boundary", mutates_args=())
def micro_batch_boundary(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    return [g.clone() for g in grads]


@micro_batch_boundary.register_fake
def _(grads):
    return [torch.empty_like(g) for g in grads]


BOUNDARY = torch.ops.bridge.micro_batch_boundary.default


@lowering(BOUNDARY)
def _boundary(grads):
    # The cut itself computes nothing: gradients arrive here already combined.
    return list(grads)


@dataclass
class _Marker:
    params: list
    stepped: bool = False   # an optimizer stepped since capture began


_active: list = []   # the parameters whose gradients backward() marks, innermost last


def _marking_backward(original):
    def backward(*args, **kwargs):
        if _active and _active[-1].stepped:
            raise MicroBatchError(with_user_line(
                "with micro-batching, loss.backward() is called after optimizer.step() in "
                "the same step; only what follows the last backward() runs once on the "
                "combined gradients, so an earlier optimizer step would run once per "
                "micro-batch: call every optimizer.step() after the last backward(), or set "
                "cstorch.backends.csx.performance.micro_batch_size = None"))
        result = original(*args, **kwargs)
        if _active:
            params = [p for p in _active[-1].params if p.grad is not None]
            if params:
                for p, g in zip(params, micro_batch_boundary([p.grad for p in params])):
                    p.grad = g
        return result
    backward.__wrapped__ = original
    return backward


class mark_gradients:
    """While active, each `torch.autograd.backward` (so each `loss.backward()`) passes the
    gradients of `params` through `micro_batch_boundary` when it returns."""

    def __init__(self, params: Iterable[torch.Tensor]):
        self.marker = _Marker(list(params))

    def __enter__(self):
        if not _active:
            self.original = torch.autograd.backward
            torch.autograd.backward = _marking_backward(self.original)
        _active.append(self.marker)
        marker = self.marker
        self.hook = register_optimizer_step_pre_hook(
            lambda *_: setattr(marker, "stepped", True))
        return self

    def __exit__(self, *exc):
        self.hook.remove()
        _active.remove(self.marker)
        if not _active:
            torch.autograd.backward = self.original
        return False


@dataclass
class Crossing:
    """A value the per-micro-batch part hands to the once-per-step part."""
    mode: str                 # "mean", "carry", "concat" or "last"
    shape: tuple              # of one micro-batch's value
    dtype: torch.dtype
    carried: int | None = None  # the placeholder a "carry" value feeds on the next micro-batch


@dataclass
class Split:
    """`per_micro_batch(*placeholders) -> [crossing values]` runs once per micro-batch
    (the batch placeholders given one micro-batch, each "carry" placeholder the value
    the previous micro-batch left); `once(*placeholders, *combined crossings)` gives the
    original graph's outputs. `concatenated` are the output positions that are
    per-sample values joined back into the whole batch."""
    per_micro_batch: fx.GraphModule
    once: fx.GraphModule
    crossings: list
    concatenated: list

    @property
    def modes(self):
        return [c.mode for c in self.crossings]

    @property
    def carried(self):
        return [c.carried for c in self.crossings if c.mode == "carry"]


def _source(node):
    trace = node.meta.get("stack_trace")
    if not trace:
        return ""
    return "\nIt was produced by:\n" + "\n".join(trace.strip().splitlines()[-2:])


def _val(node):
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


def _is_float(val):
    return val is not None and (val.dtype.is_floating_point or val.dtype.is_complex)


def _inputs(node):
    return node.all_input_nodes


def split_at_gradients(gm: fx.GraphModule, batch: Sequence[int], carried: Mapping[int, int],
                       micro: int) -> Split:
    """Split `gm` for micro-batches of `micro` samples.

    `batch` are the positions of the placeholders that hold one micro-batch of the batch;
    `carried` maps an output position to the placeholder that holds the same state (its
    value before the step). The graph must have been captured under `mark_gradients`;
    without a boundary (a step without `backward()`) everything that reads the batch runs
    per micro-batch.
    """
    part = _Partition.of(gm, batch, carried)
    crossings = _Crossings(part, micro)
    if part.cut is not None:
        for x in _inputs(part.cut):
            if part.per_micro(x):
                crossings.for_once(x, part.cut, gradient=True)
    crossings.for_outputs(carried)
    once_nodes = [n for n in part.calls if n not in part.per_mb]
    for n in once_nodes:
        for x in _inputs(n):
            if part.per_micro(x):
                crossings.for_once(x, n)

    first = _subgraph(gm, part.placeholders, [n for n in part.calls if n in part.per_mb], {},
                      crossings.sources, None)
    second = _subgraph(gm, part.placeholders, once_nodes, crossings.use_in_once, part.outs,
                       crossings.use_in_output, n_crossings=len(crossings.crossings))
    return Split(first, second, crossings.crossings, crossings.concatenated)


@dataclass
class _Partition:
    """Which nodes of a captured step run per micro-batch (`per_mb`: everything before
    the last gradient boundary, and what reads the batch without passing the boundary) and
    which run once on the combined gradients (the rest)."""
    placeholders: list
    outs: list
    batch_nodes: set
    cut: fx.Node | None       # the last gradient boundary
    calls: list
    reads_batch: set          # nodes per-sample data flows into
    per_mb: set
    carried_at: dict          # placeholder -> the per-micro-batch node holding its next value
    varies: set               # nodes whose value differs between micro-batches

    @classmethod
    def of(cls, gm, batch, carried) -> "_Partition":
        nodes = list(gm.graph.nodes)
        order = {n: i for i, n in enumerate(nodes)}
        placeholders = [n for n in nodes if n.op == "placeholder"]
        output = next(n for n in nodes if n.op == "output")
        outs = list(output.args[0])
        batch_nodes = {placeholders[i] for i in batch}
        cuts = [n for n in nodes if n.op == "call_function" and n.target is BOUNDARY]
        cut = cuts[-1] if cuts else None
        calls = [n for n in nodes if n.op == "call_function"]

        after_cut = set()
        reads_batch = set(batch_nodes)   # per-sample data flows here; the cut combines it away
        for n in calls:
            ins = _inputs(n)
            if n is cut or any(x in after_cut for x in ins):
                after_cut.add(n)
            if n is not cut and any(x in reads_batch for x in ins):
                reads_batch.add(n)

        per_mb = {n for n in calls if (cut is not None and order[n] < order[cut])
                  or (n in reads_batch and n not in after_cut)}
        stack = list(per_mb)
        while stack:
            for x in _inputs(stack.pop()):
                if x.op == "call_function" and x not in per_mb:
                    per_mb.add(x)
                    stack.append(x)

        carried_at = {}
        for pos, ph in carried.items():
            value = outs[pos]
            if isinstance(value, fx.Node) and value in per_mb:
                carried_at[placeholders[ph]] = value
        if len(cuts) > 1:
            _refuse_updates_between_backwards(cuts[:-1], carried_at, calls)

        # Whether a value differs between micro-batches: it reads the batch, carried state
        # or random numbers (each micro-batch draws its own).
        varies = set(batch_nodes) | set(carried_at)
        for n in calls:
            if (torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
                    or any(x in varies for x in _inputs(n))):
                varies.add(n)
        return cls(placeholders, outs, batch_nodes, cut, calls, reads_batch, per_mb,
                   carried_at, varies)

    def per_micro(self, node) -> bool:
        return node in self.per_mb or node in self.batch_nodes


class _Crossings:
    """The values the per-micro-batch part hands to the once-per-step part, and how each
    is combined across micro-batches."""

    def __init__(self, part: _Partition, micro: int):
        self.part, self.micro = part, micro
        self.crossings: list[Crossing] = []
        self.sources: list[fx.Node] = []
        self._index: dict = {}
        self.use_in_once: dict = {}     # node -> the crossing once-per-step nodes read
        self.use_in_output: dict = {}   # output position -> the crossing it is
        self.concatenated: list = []
        # placeholder -> its "carry" crossing
        self.carry_index = {ph: self.cross(value, "carry", part.placeholders.index(ph))
                            for ph, value in part.carried_at.items()}
        self.carry_of = {value: self.carry_index[ph] for ph, value in part.carried_at.items()}

    def cross(self, node, mode, carried_ph=None):
        """The crossing handing on `node` in `mode`: one per node and mode, except that
        each carried placeholder has its own (two cells may take the same new value)."""
        key = (node, mode, carried_ph)
        if key not in self._index:
            val = _val(node)
            self._index[key] = len(self.crossings)
            shape, dtype = (tuple(val.shape), val.dtype) if val is not None else ((), torch.float32)
            self.crossings.append(Crossing(mode, shape, dtype, carried_ph))
            self.sources.append(node)
        return self._index[key]

    def for_once(self, node, consumer, gradient=False):
        """The crossing a once-per-step node reads for per-micro-batch `node`."""
        part = self.part
        if node not in self.use_in_once:
            val = _val(node)
            per_sample = (node in part.reads_batch and val is not None and val.ndim >= 1
                          and val.shape[0] == self.micro and node not in self.carry_of
                          and not gradient)
            if node in part.batch_nodes or per_sample:
                raise MicroBatchError(
                    f"with micro-batching, per-sample values of the batch (shape "
                    f"{tuple(val.shape) if val is not None else '?'}) are used after "
                    f"loss.backward() by {consumer.target}{_source(consumer)}\nEach "
                    "micro-batch's forward and backward run first, then what follows backward() "
                    "runs once on the combined gradients, where no single micro-batch's samples "
                    "exist: compute what needs the batch before loss.backward(), or set "
                    "cstorch.backends.csx.performance.micro_batch_size = None")
            if node in self.carry_of:
                self.use_in_once[node] = self.carry_of[node]
            elif node not in part.varies:
                self.use_in_once[node] = self.cross(node, "last")
            elif _is_float(val):
                self.use_in_once[node] = self.cross(node, "mean")
            else:
                raise MicroBatchError(
                    f"with micro-batching, a non-float value "
                    f"({val.dtype if val is not None else 'a tensor'}) computed per micro-batch "
                    f"is used after loss.backward() by {consumer.target}{_source(node)}\n"
                    "Only float values can be combined across micro-batches "
                    "(by their mean); compute it after backward() from values that do not "
                    "depend on the batch, or set "
                    "cstorch.backends.csx.performance.micro_batch_size = None")
        return self.use_in_once[node]

    def for_outputs(self, carried):
        """The crossing of each step output computed per micro-batch."""
        part = self.part
        for pos, value in enumerate(part.outs):
            if not isinstance(value, fx.Node) or not part.per_micro(value):
                continue
            val = _val(value)
            if pos in carried and part.placeholders[carried[pos]] in self.carry_index:
                self.use_in_output[pos] = self.carry_index[part.placeholders[carried[pos]]]
            elif value not in part.varies:
                self.use_in_output[pos] = self.cross(value, "last")
            elif (val is not None and val.ndim >= 1 and val.shape[0] == self.micro
                  and value in part.reads_batch):
                self.use_in_output[pos] = self.cross(value, "concat")
                self.concatenated.append(pos)
            elif _is_float(val):
                self.use_in_output[pos] = self.cross(value, "mean")
            else:
                self.use_in_output[pos] = self.cross(value, "last")


def _refuse_updates_between_backwards(early_cuts, carried_at, calls):
    """A state update between two backward() calls would run once per micro-batch: an
    optimizer stepping on each micro-batch's gradients, not on the batch's."""
    downstream = set(early_cuts)
    for n in calls:
        if n in downstream or any(x in downstream for x in _inputs(n)):
            downstream.add(n)
    for ph, value in carried_at.items():
        if value in downstream:
            raise MicroBatchError(
                f"with micro-batching, the state held in input {ph.name!r} is updated from "
                f"gradients before the step's last loss.backward(){_source(value)}\nOnly what "
                "follows the last backward() runs once on the combined gradients; call every "
                "optimizer.step() after the last backward(), or set "
                "cstorch.backends.csx.performance.micro_batch_size = None")


def _subgraph(gm, placeholders, body, use_in_once, outs, use_in_output, n_crossings=None):
    """A graph of `gm`'s placeholders (then `n_crossings` more), the `body` nodes in their
    order, and `outs` as outputs. Per-micro-batch values the body reads come from the
    crossing placeholders `use_in_once` names; outputs from `use_in_output` (by position)."""
    graph = fx.Graph()
    env = {}
    for ph in placeholders:
        env[ph] = graph.placeholder(ph.name)
        env[ph].meta = dict(ph.meta)
    extra = [graph.placeholder(f"crossing_{i}") for i in range(n_crossings or 0)]
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            env[n] = graph.node_copy(n, lambda x: env[x])
    body_set = set(body)
    for n in body:
        env[n] = graph.node_copy(n, lambda x: extra[use_in_once[x]]
                                 if x in use_in_once and x not in body_set else env[x])
    result = []
    for pos, value in enumerate(outs):
        if use_in_output is not None and pos in use_in_output:
            result.append(extra[use_in_output[pos]])
        elif isinstance(value, fx.Node):
            result.append(env[value])
        else:
            result.append(value)
    graph.output(result)
    graph.eliminate_dead_code()
    return fx.GraphModule(gm, graph)
