"""`@cstorch.trace`: the step a user calls. Each call finds its program in the step's
`ProgramCache` (capturing it the first time), gathers the call's `StepData` and runs it
(`call`); `to_jax` gives the step as plain JAX (`jax_view`)."""
import functools
from collections.abc import Callable

import wafer
from cstorch.backend import current_or_cpu_backend
from cstorch.run.capture_context import is_capturing
from cstorch.tracing import call as calling
from cstorch.tracing import index_check
from cstorch.tracing.arguments import split_call
from cstorch.tracing.capture import capture_program
from cstorch.tracing.jax_view import JaxStep, jax_step
from cstorch.tracing.program_cache import ProgramCache


class TracedStep:
    """The callable `@cstorch.trace` returns."""

    def __init__(self, step_fn: Callable):
        functools.update_wrapper(self, step_fn)
        self.step_fn = step_fn
        self.cache = ProgramCache(step_fn, getattr(step_fn, "__name__", "step"))
        self._device_inputs = calling.DeviceInputs()
        self._warned_input_grad = False

    @property
    def name(self):
        return self.cache.name

    @property
    def programs(self) -> dict:
        """key -> the programs captured for it, told apart by their gradient rules."""
        return self.cache.programs

    @property
    def captures(self) -> int:
        """How many times the step was captured."""
        return self.cache.captures

    @property
    def compiles(self) -> int:
        """How many of the captures compiled a program: a capture that computes like the
        program a changed Python value set aside takes that program's compiled step."""
        return self.cache.compiles

    @property
    def warm_starts(self) -> int:
        """How many programs were taken from `compile_dir` without a capture."""
        return self.cache.warm_starts

    @property
    def recaptures(self) -> list:
        """Why each capture after the first happened."""
        return self.cache.recaptures

    def __get__(self, obj, objtype=None):
        """`@cstorch.trace` on a method (Model Zoo's `Trainer.training_step`): read from an
        instance, the step bound to that instance, with its own programs. The instance
        keeps it (in its `__dict__`), so every later read finds the same step."""
        bind = getattr(type(self.step_fn), "__get__", None)
        if obj is None or bind is None:
            return self
        attrs = getattr(obj, "__dict__", None)
        steps = attrs.setdefault("_cstorch_traced_steps", {}) if attrs is not None else {}
        bound = steps.get(id(self))
        if bound is None:
            bound = steps[id(self)] = TracedStep(bind(self.step_fn, obj, objtype))
        return bound

    def __call__(self, *args, **kwargs):
        if is_capturing():
            return self.step_fn(*args, **kwargs)
        backend = current_or_cpu_backend()
        state = backend.state
        # The layout must stay as it is from the capture to the results' return: the
        # state of a model collected meanwhile is dropped after.
        with state.in_use:
            state.sync()
            call = split_call(args, kwargs)
            program, values = self.cache.program(backend, call)
            if not backend.executes:
                return calling.not_executed(program, backend)
            if backend.drops_data == "drop_data" and state.complete_at != state.version:
                calling.check_values(state)
            index_check.raise_pending(wait=False)
            if not self._warned_input_grad and any([t.requires_grad for t in call.tensors]):
                self._warned_input_grad = True
                calling.warn_input_grad(self.name, call.tensors)
            data = calling.step_data(program, values, backend, call, self._device_inputs)
            return calling.run(program, data, backend, self.name)

    def to_jax(self, *args, **kwargs) -> JaxStep:
        """The pure JAX function of this step for these arguments, with the current state.

        Captures the step if it has not been captured for arguments like these; runs nothing.
        """
        backend = current_or_cpu_backend()
        with backend.state.in_use:
            backend.state.sync()
            call = split_call(args, kwargs)
            program, values = self.cache.program(backend, call)
            if program.jax_fn is None:   # taken from compile_dir, which keeps no JAX function
                program = capture_program(self.step_fn, backend, call, self.name)
                self.cache.captures += 1
                self.cache.compiles += 1
            wafer.artifact_writer.wait()   # nothing is dispatched to write them beside
            return jax_step(program, values, backend, call)
