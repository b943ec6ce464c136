"""The program cache of one traced step: which captured program a call runs.

A call finds its program by what programs depend on: the call's arguments (tensors by
shape and dtype, everything else by value), the run's state layout (`RunState.version`:
entries, ties, modules used), `requires_grad` and train/eval flags, and the optimizers'
non-float group values and which float ones are zero. A program is then taken only while
the plain Python values the step read (`python_values`) and the hooks it ran (`hooks`)
are as they were at its capture. Float hyperparameters are inputs, so a changed learning
rate reuses the program.
"""
import logging
import warnings

import torch

from cstorch.backends import csx
from cstorch.optim.optimizer import group_writes
from cstorch.tracing import index_check, micro_batch, python_values, warm
from cstorch.tracing.arguments import fingerprint
from cstorch.tracing.capture import capture_program
from cstorch.tracing.changes import describe_graph_change, describe_key_change

log = logging.getLogger("cstorch")
_PLAIN = (bool, int, str, type(None))
# A Python value that has changed the program this many times is worth a warning.
VALUE_CAPTURES_WARNED = 3


class ProgramCache:
    """The programs captured for one step function, and why each recapture happened."""

    def __init__(self, step_fn, name: str):
        self.step_fn = step_fn
        self.name = name
        self.programs: dict = {}   # key -> [Program], told apart by their gradient rules
        self.captures = 0
        # Captures that compiled a program: a capture that computes like a program set
        # aside for a changed Python value takes its compiled step (`reuse`).
        self.compiles = 0
        self.warm_starts = 0   # programs taken from compile_dir without a capture
        self.recaptures: list = []   # why each capture after the first happened
        self._groups_cache = None
        self._last = None   # (key, programs) of the last call
        self._value_captures: dict = {}   # Python value's name -> captures it caused

    def key(self, backend, call):
        """What the program for this call depends on, and the float hyperparameters' values."""
        state = backend.state
        static, values = self._groups(backend)
        key = (call.key, state.version, tuple([m.training for m in state.modules()]),
               state.requires_grad_key(), static, micro_batch.key(backend, self.name),
               backend.precision_level, csx.debug.check_finite, index_check.enabled(backend),
               # torch's own settings the capture follows, as eager PyTorch would
               (torch.get_default_dtype(),
                torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")),
               csx.performance.scan_blocks, csx.performance.scan_blocks_remat,
               csx.performance.trace_blocks_once)
        return key, values

    def _groups(self, backend):
        """(what programs depend on, float values) of the optimizers' param groups, looked
        at again only after a write to a group (`ParamGroup`), a new list of groups, or
        every call while a group holds a mutable value (a set of tags, ...)."""
        stamp = (group_writes(), [id(opt.param_groups) for opt in backend.optimizers])
        cached = self._groups_cache
        if cached is not None and cached[0] == stamp:
            return cached[1], cached[2]
        values, static, mutable = [], [], False
        for opt in backend.optimizers:
            for group in opt.param_groups:
                for k, v in group.items():
                    kind = type(v)
                    if kind is float:
                        values.append(v)
                        static.append((k, _float_is_zero(v)))
                    elif kind in _PLAIN:
                        static.append((k, (kind, v)))
                    elif kind is tuple:
                        for x in v:
                            if type(x) is float:
                                values.append(x)
                                static.append((k, _float_is_zero(x)))
                            else:
                                static.append((k, fingerprint(x)))
                                mutable = mutable or type(x) not in _PLAIN
                    elif k != "params" and not isinstance(v, torch.Tensor):
                        static.append((k, fingerprint(v)))
                        mutable = True
        static = tuple(static)
        self._groups_cache = None if mutable else (stamp, static, values)
        return static, values

    def program(self, backend, call):
        """The program for this call, captured now if none fits; and the float
        hyperparameters' values it takes."""
        key, values = self.key(backend, call)
        state = backend.state
        if backend.retrace_every_iteration:
            candidates = []
        elif self._last is not None and self._last[0] == key:
            candidates = self._last[1]   # the same key as the last call: no dict lookup
        else:
            candidates = self.programs.setdefault(key, [])
        stale = None
        moved = []   # (program, name, reason) set aside for a change, the latest first
        for program in candidates:
            if all(state.has_grad(i) == present for i, present in program.grad_rule.items()):
                stale = program.constants_changed() if program.constants else None
                if stale is not None:
                    candidates.remove(program)   # it computes with the tensor's old value
                    break
                # A new program is judged against each program a change set aside, the
                # latest first: the one it computes like is the one it replaces.
                change = python_values.first_change(program.python_values)
                if change is not None:   # it was captured with another value of it
                    name, before, now = change
                    moved.insert(0, (program, name, (
                        f"{name} changed from {python_values.describe(before)} to "
                        f"{python_values.describe(now)}")))
                    continue
                if program.hooks is not None and program.hooks.changed():
                    moved.insert(0, (program, None, (
                        "a hook the step runs (a module's forward or backward hook, a "
                        "parameter's gradient hook, an optimizer's step hook) was registered "
                        "or removed")))
                    continue
                self._last = (key, candidates)
                return program, values
        previous = self._last
        if stale is not None:
            reason = (f"a tensor of shape {tuple(stale.shape)} that the step closes over (not "
                      f"an argument) was written in place or given new data since the capture")
            warnings.warn(f"cstorch: {self.name}: {reason}; capturing it again, so that the "
                          f"step computes with its new value. Pass the tensor to the step as "
                          f"an argument, and a new value needs no new capture.", stacklevel=3)
        like = [m[0] for m in moved]
        program, stored = warm.capture_or_load(
            self, backend, call, key,
            lambda: capture_program(self.step_fn, backend, call, self.name, like=like))
        state.note_cache(self)
        if stored:
            self.warm_starts += 1
        else:
            self.captures += 1
            if not any(program.compiled is old.compiled for old in like):
                self.compiles += 1
        # Registering modules during capture changes the state layout: key by the result.
        key, values = self.key(backend, call)
        if backend.retrace_every_iteration:
            self._log_graph_change(previous, program)
            self.programs[key] = [program]   # one program per key: a long run keeps no history
        else:
            if stale is not None:
                self.recaptures.append([reason])
            elif moved:
                self._value_recapture(moved, candidates, program)
            elif previous is not None:
                self._log_recapture(previous[0], key)
            self.programs.setdefault(key, []).append(program)
        self._last = (key, self.programs[key])
        return program, values

    def drop_layouts_before(self, version: int):
        """Forget the programs captured for a state layout older than `version`: the
        layout is part of their key, so none of them can run again, and they would keep
        what they hold (the gradients they left, the module attributes they watch) of a
        model the user dropped."""
        # A key's second item is the layout's version (`key`).
        self.programs = {k: v for k, v in self.programs.items() if k[1] >= version}
        if self._last is not None and self._last[0][1] < version:
            self._last = None

    def _value_recapture(self, moved, candidates, program):
        """Python values or the modules' hooks changed since the programs `moved` were
        captured. If the new program computes just as one of them did, the change does not
        matter to it: it replaces that one, and does not watch the values that changed."""
        for old, _name, reason in moved:
            if program.compiled is old.compiled or old.computes_like(program):
                changed = set(python_values.changes(old.python_values))
                kept = {w[1] for w in old.python_values} - changed
                program.python_values = tuple(w for w in program.python_values
                                              if w[1] in kept)
                if old in candidates:
                    candidates.remove(old)
                log.info("cstorch: %s captured again (program %d), which left the program "
                         "the same%s: %s%s", self.name, self.captures,
                         " (its compiled step taken again)"
                         if program.compiled is old.compiled else "", reason,
                         f"; {', '.join(sorted(changed))} no longer watched" if changed else "")
                return
        _, name, reason = moved[0]
        self.recaptures.append([reason])
        log.info("cstorch: %s captured again (program %d): %s", self.name, self.captures, reason)
        if name is None:
            return
        count = self._value_captures[name] = self._value_captures.get(name, 0) + 1
        if count == VALUE_CAPTURES_WARNED:
            warnings.warn(
                f"cstorch: {self.name}: {name} has changed the captured program {count} times, "
                f"and every new value captures and compiles the step again (seconds each). Hold "
                f"a value that changes during training in a tensor (a buffer of the module, or "
                f"a step argument), which reaches the program as an input.", stacklevel=4)

    def _log_recapture(self, old_key, new_key):
        reasons = describe_key_change(old_key, new_key)
        self.recaptures.append(reasons)
        log.info("cstorch: %s captured again (program %d): %s", self.name, self.captures,
                 "; ".join(reasons))

    def _log_graph_change(self, previous, program):
        if previous is None or not previous[1]:
            return
        old, new = previous[1][-1].graph.code, program.graph.code
        if old != new:
            lines = describe_graph_change(old, new)
            self.recaptures.append(lines)
            log.warning("cstorch: the graph of %s changed at capture %d:\n%s", self.name,
                        self.captures, "\n".join(lines))


def _float_is_zero(value: float) -> tuple:
    """A float hyperparameter's part of a program key. The program takes the value as an
    input, but whether it is zero shapes the graph (a zero weight decay is left out). Tagged,
    so that it never equals an int or bool's part: `(k, False) == (k, 0)`, and an int 0
    changed to a float 0.1 would otherwise reuse a program that has no input for it."""
    return (float, value == 0)
