"""What a captured step is: the compiled program and what a call needs to know to feed it
and to hand its results back."""
import re
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable

import torch

from cstorch.tracing.arguments import Results
from cstorch.tracing.same_function import same_callable


@dataclass
class Program:
    """One captured and compiled step."""
    graph: Any
    jax_fn: Callable          # fn(state list, grads list, hyper, inputs list, rng) -> (state, grads, outs);
                              # hyper: the traced hyperparameters' values, then their complements
    compiled: Any             # wafer.CompiledStep
    names: list               # state names, in the order of the state list
    grad_inputs: list         # cells whose torch-side gradient is an input
    grad_outputs: list        # cells whose gradient the step leaves
    grad_rule: dict           # cell -> whether a gradient must be present for this program
    hyper: list               # (optimizer index, group index, key, tuple index) of traced hyperparameters
    results: Results
    out_dtypes: list          # torch dtype of every tensor output (results, then closures)
    out_shapes: list
    closures: list
    uses_rng: bool = True     # whether the program draws random numbers
    grad_source: Any = None   # bridge.device_tensor.GradSource of the gradients it leaves
    grads_bound: int = -1     # the state version the parameters' gradient slots were bound at
    grad_layout: Any = None   # gradients returned packed: see grad_layout
    micro_batch_size: int | None = None   # None: the batch runs whole
    explored: Any = None      # micro_batch.ExploreResult of an "explore" program, which trains nothing
    finite_check: Any = None  # what each flag of the last output covers (debug.check_finite)
    # With debug.check_indices: the bridge.index_checks.IndexCheck each row of the last
    # output (after the finite flags) covers.
    index_checks: Any = None
    unread_grads: frozenset = frozenset()   # positions in grad_inputs the program never reads
    # An unread gradient input still needs an array of its shape: {input position: array},
    # one array of zeros per shape, dtype and sharding (keeping the first call's gradients
    # instead held a whole set of gradients for as long as the program lived).
    unread_grad_arrays: dict = field(default_factory=dict)
    # Host tensors the step closed over, which the program holds as constants, each with
    # its version counter (None for an inference tensor, which has none) and data pointer
    # at the capture: `constants_changed`.
    constants: tuple = ()
    # Python values the step may have read, as they were at the end of the capture
    # (`python_values`): attributes of the compiled modules, globals and closure variables.
    python_values: tuple = ()
    hooks: Any = None         # hooks.Hooks: the hooks the step ran, as at the capture
    # (result position, cell) of results that are a state tensor itself (`return
    # model.weight`): the call returns that tensor, as eager PyTorch returns the object.
    held_results: tuple = ()
    # The state cells the program takes and returns, in order (None: every cell). The
    # other cells, which the step neither reads nor writes (a model it does not use), stay
    # out of the program and keep their arrays.
    used: tuple | None = None
    # The program's state list where it holds groups of cells stacked (`state_slots`): per
    # entry a cell index or a group's cell indices. None: one entry per cell of `used`.
    slots: tuple | None = None

    def constants_changed(self):
        """The first constant written in place (or given new data) since the capture,
        or None: the program still computes with the value it had then."""
        for t, version, data in self.constants:
            if (version is not None and t._version != version) or t.data_ptr() != data:
                return t
        return None

    def _body(self) -> str:
        """The graph's code without its signature, each input named for what it is: a
        program captured while gradients were present takes them as inputs even when it
        never reads them, which shifts the positional names of every later input."""
        n, g, h = len(self.names), len(self.grad_inputs), 2 * len(self.hyper)
        roles = {}
        for k, node in enumerate(n for n in self.graph.graph.nodes if n.op == "placeholder"):
            roles[node.name] = (f"state_{k}" if k < n else
                                f"grad_{self.grad_inputs[k - n]}" if k < n + g else
                                f"hyper_{k - n - g}" if k < n + g + h else
                                f"input_{k - n - g - h}")
        lines = self.graph.code.strip().split("\n")[1:]   # after `def forward(self, ...):`
        return re.sub(r"\b\w+\b", lambda m: roles.get(m.group(0), m.group(0)), "\n".join(lines))

    def computes_like(self, other) -> bool:
        """Whether `other`, captured for the same key, is this program again: the same
        graph, constants (closed-over tensors by identity, tensors made in the step by
        value), non-tensor results and step-closure arguments."""
        def equal(a, b):
            try:
                return bool(a == b)
            except Exception:   # values without a plain equality (arrays, ...)
                return False

        def made(program):
            gm = program.graph
            return [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]

        if self.graph is None or other.graph is None:   # one taken from compile_dir
            return False
        mine, theirs = made(self), made(other)
        return (self._body() == other._body()
                and [id(c[0]) for c in self.constants] == [id(c[0]) for c in other.constants]
                and len(mine) == len(theirs)
                and all(type(a) is type(b) and (
                    a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                    if isinstance(a, torch.Tensor) else equal(a, b))
                    for a, b in zip(mine, theirs))
                and self.grad_rule == other.grad_rule
                and self.micro_batch_size == other.micro_batch_size
                and equal(self.results, other.results)
                and len(self.closures) == len(other.closures)
                and all(same_callable(a.fn, b.fn) and equal(a.leaves, b.leaves)
                        for a, b in zip(self.closures, other.closures)))


@dataclass
class ValueSpec:
    """Shape and dtype of a state value: what capture fakes it from."""
    shape: tuple
    dtype: torch.dtype
