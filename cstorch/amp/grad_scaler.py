"""`cstorch.amp.GradScaler`: loss scaling decided on the device, inside a traced step.

torch's `GradScaler` reads `found_inf` on the host to decide whether to skip the optimizer
step, which a compiled step cannot do. Here every decision is a tensor: the step always
runs, and where the gradients were not finite its results are replaced by the values from
before it (parameters and optimizer state), so a skipped step leaves them as they were.
The scale and the counters of dynamic scaling are state of the run, updated in the program.

Dynamic scaling follows the reference's rules: a step whose gradients are not finite is
skipped, and halves the scale when the overflows since the last rescale, over the steps
since it, exceed `overflow_tolerance`; a finite step doubles the scale once the steps since
the last rescale exceed `steps_per_increase`. The scale is clamped to `max_loss_scale` and
then to `min_loss_scale`; `get_non_clamped_scale()` is the value before the lower clamp.
"""
import warnings
from numbers import Number

import torch

from cstorch.amp.half_dtype import get_half_dtype_str
from cstorch.backend import current_or_cpu_backend

_STEPS_PER_INCREASE = 2000
_MIN_LOSS_SCALE = 2.0 ** -14
# The largest scale: what float16 and bfloat16 losses take (2**15), cbfloat16's is 2**31.
_MAX_LOSS_SCALE = {"cbfloat16": 2.0 ** 31}
_DEFAULT_MAX_LOSS_SCALE = 2.0 ** 15


class _ScalerState(torch.nn.Module):
    def __init__(self, scale: float, unclamped: float):
        super().__init__()
        self.register_buffer("scale", torch.tensor(float(scale), dtype=torch.float32))
        self.register_buffer("unclamped_scale", torch.tensor(float(unclamped),
                                                             dtype=torch.float32))
        self.register_buffer("steps_since_rescale", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("overflows_since_rescale", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("num_skipped_steps", torch.tensor(0, dtype=torch.int64))
        # Whether a gradient unscaled since the last update was not finite, and whether
        # the last updated step's gradients were all finite.
        self.register_buffer("found_inf", torch.tensor(False))
        self.register_buffer("last_isfinite", torch.tensor(True))


class _AmpStash:
    """What an optimizer stepped by a `GradScaler` carries as ``optimizer._amp_stash``:
    `isfinite`, whether the gradients of its last step were all finite (None for a static
    scaler, which does not check)."""

    def __init__(self, scaler: "GradScaler"):
        self.scaler = scaler

    @property
    def isfinite(self):
        scaler = self.scaler
        if not scaler.dynamic:
            return None
        state = scaler._state
        return ~state.found_inf if scaler._unscaled else state.last_isfinite


class GradScaler:
    """Loss scaling for mixed precision training.

    Use it through `cstorch.amp.optimizer_step(loss, optimizer, scaler)`, or step by step
    as torch's `GradScaler` (``scaler.scale(loss).backward()``, ``scaler.step(optimizer)``,
    ``scaler.update()``), or with the reference's finer calls
    (`clip_gradients_and_return_isfinite`, `step_if_finite`, `update_scale`).

    `loss_scale`: "dynamic" for dynamic loss scaling, a number for a constant scale, or
    None for no scaling (a scale of 1.0; the loss is not scaled). With dynamic scaling the
    scale starts at `init_scale` (2**15, 2**31 for cbfloat16), kept within
    [`min_loss_scale`, `max_loss_scale`] (2**-14, and 2**15 or 2**31 for cbfloat16); a
    step whose gradients hold an inf or NaN is skipped (parameters and optimizer state
    keep their values) and may halve the scale (see the module's rules, `overflow_tolerance`
    the fraction of overflowing steps tolerated), and the scale doubles after more than
    `steps_per_increase` (2000) steps since the last change. A static scaler does not
    check the gradients: a non-finite one reaches the optimizer, as in the reference.
    `max_gradient_norm`, when given, clips the unscaled gradients to that global norm
    before the optimizer step.
    """

    def __init__(self, loss_scale: str | float | None = None,
                 init_scale: float | None = None, steps_per_increase: int | None = None,
                 min_loss_scale: float | None = None, max_loss_scale: float | None = None,
                 overflow_tolerance: float = 0.0, max_gradient_norm: float | None = None):
        if loss_scale == "dynamic":
            self.dynamic = True
        elif loss_scale is None or (isinstance(loss_scale, Number)
                                    and not isinstance(loss_scale, bool) and loss_scale > 0):
            self.dynamic = False
        else:
            raise ValueError(f"loss_scale must be \"dynamic\", a positive number or None, got "
                             f"{loss_scale!r}")
        if max_gradient_norm is not None and not max_gradient_norm > 0:
            raise ValueError(f"max_gradient_norm must be positive, got {max_gradient_norm!r}")
        default_max = _MAX_LOSS_SCALE.get(get_half_dtype_str(), _DEFAULT_MAX_LOSS_SCALE)
        self.steps_per_increase = (_STEPS_PER_INCREASE if steps_per_increase is None
                                   else steps_per_increase)
        self.min_loss_scale = _MIN_LOSS_SCALE if min_loss_scale is None else min_loss_scale
        self.max_loss_scale = default_max if max_loss_scale is None else max_loss_scale
        if self.dynamic:
            init_scale = default_max if init_scale is None else init_scale
            for k, v in (("init_scale", init_scale), ("min_loss_scale", self.min_loss_scale),
                         ("max_loss_scale", self.max_loss_scale)):
                if isinstance(v, bool) or not isinstance(v, Number) or not v > 0:
                    raise ValueError(f"{k} must be a positive number, got {v!r}")
            steps = self.steps_per_increase
            if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
                raise ValueError(f"steps_per_increase must be a positive int, got {steps!r}")
            if self.min_loss_scale < _MIN_LOSS_SCALE:
                raise ValueError("min_loss_scale too small")
            if self.min_loss_scale > self.max_loss_scale:
                raise ValueError(f"min_loss_scale {self.min_loss_scale} is above "
                                 f"max_loss_scale {self.max_loss_scale}")
            if isinstance(overflow_tolerance, bool) or not isinstance(overflow_tolerance, Number):
                raise TypeError(f"overflow_tolerance must be a number, got "
                                f"{overflow_tolerance!r}")
            if overflow_tolerance < 0:
                raise ValueError("loss scaling counter threshold must be set >= 0")
            self.overflow_tolerance = overflow_tolerance
            unclamped = min(float(init_scale), float(self.max_loss_scale))
            scale = max(unclamped, float(self.min_loss_scale))
        else:
            unused = [k for k, v in (("init_scale", init_scale),
                                     ("steps_per_increase", steps_per_increase),
                                     ("min_loss_scale", min_loss_scale),
                                     ("max_loss_scale", max_loss_scale)) if v is not None]
            if overflow_tolerance != 0.0:
                unused.append("overflow_tolerance")
            if unused:
                warnings.warn(f"GradScaler: {', '.join(unused)} only apply to "
                              f"loss_scale=\"dynamic\" and are ignored", stacklevel=2)
            self.overflow_tolerance = None
            scale = unclamped = 1.0 if loss_scale is None else float(loss_scale)
        self.loss_scale = loss_scale
        #: Whether `scale(loss)` multiplies the loss (False only for loss_scale=None).
        self.loss_is_scaled = loss_scale is not None
        self.max_gradient_norm = max_gradient_norm
        self._static_scale = scale
        self._state = _ScalerState(scale, unclamped)
        backend = current_or_cpu_backend()
        self.name = backend.state.add_holder("grad_scaler", self._state)
        self._unscaled: dict = {}   # id -> optimizer unscaled since the last update
        self._updated = False       # whether the state has left its initial values

    # the reference's calls ---------------------------------------------------------------
    def scale(self, loss):
        """`loss` times the current loss scale (unchanged when the scaler does not scale).
        A structure of tensors (list, tuple, dict) is scaled element by element."""
        if isinstance(loss, (list, tuple)):
            return type(loss)(self.scale(o) for o in loss)
        if isinstance(loss, dict):
            return {k: self.scale(v) for k, v in loss.items()}
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"GradScaler.scale expects the loss as a tensor, got "
                            f"{type(loss).__name__}")
        if not self.loss_is_scaled:
            return loss
        if not self.dynamic:
            return loss * self._static_scale
        return loss * self._state.scale   # dtype promotion as in torch

    def clip_gradients_and_return_isfinite(self, optimizers):
        """Unscale the gradients of each of `optimizers` (an optimizer or a list), clip
        them to `max_gradient_norm` (their global norm, when set) and return whether they
        are all finite: a bool tensor, or None for a static scaler, which does not check.
        Each optimizer's ``_amp_stash.isfinite`` says the same."""
        optimizers = _as_list(optimizers)
        for optimizer in optimizers:
            if id(optimizer) not in self._unscaled:
                self.unscale_(optimizer)
        if self.max_gradient_norm is not None:
            clip_grad_norm_(optimizers, self.max_gradient_norm)
        return self._isfinite()

    def _isfinite(self):
        return ~self._state.found_inf if self.dynamic else None

    def unscale_(self, optimizer):
        """Divide the gradients of `optimizer`'s parameters by the loss scale, in place,
        and (dynamic scaling) note whether any is not finite. At most once per optimizer
        between updates."""
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update(); call it once per optimizer and step")
        self._unscaled[id(optimizer)] = optimizer
        optimizer._amp_stash = _AmpStash(self)
        if self.dynamic:
            inverse = self._state.scale.double().reciprocal().float()
        else:
            inverse = torch.tensor(1.0 / self._static_scale, dtype=torch.float32)
        found = self._state.found_inf
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if self.dynamic:
                    found = found | ~torch.isfinite(p.grad).all()
                if self.loss_is_scaled:
                    p.grad.mul_(inverse.to(p.grad.dtype))
        if self.dynamic:
            self._state.found_inf.copy_(found)

    def step_if_finite(self, optimizer, *args, **kwargs):
        """Step `optimizer`; with dynamic scaling, where the gradients unscaled this step
        were not finite the step leaves parameters and optimizer state as they were."""
        if not self.dynamic:
            return optimizer.step(*args, **kwargs)
        before = [(t, t.detach().clone()) for t in _stepped_tensors(optimizer)]
        result = optimizer.step(*args, **kwargs)
        skip = self._state.found_inf
        with torch.no_grad():
            for tensor, old in before:
                tensor.copy_(torch.where(skip, old, tensor))
        return result

    def step(self, optimizer, *args, **kwargs):
        """Unscale and clip the gradients (unless done), then `step_if_finite`."""
        if id(optimizer) not in self._unscaled:
            self.clip_gradients_and_return_isfinite([optimizer])
        return self.step_if_finite(optimizer, *args, **kwargs)

    def update_scale(self, optimizers):
        """After `optimizers` stepped: count a skipped step and rescale (dynamic scaling,
        the module's rules); the next step starts afresh."""
        state = self._state
        self._updated = True
        with torch.no_grad():
            if self.dynamic:
                found = state.found_inf
                steps = state.steps_since_rescale + 1
                overflows = state.overflows_since_rescale + found.to(torch.int64)
                ratio = overflows.to(torch.float32) / steps.to(torch.float32)
                halve = found & (ratio > self.overflow_tolerance)
                double = ~found & (steps > self.steps_per_increase)
                factor = torch.where(halve, torch.tensor(0.5),
                                     torch.where(double, torch.tensor(2.0), torch.tensor(1.0)))
                unclamped = torch.clamp(state.scale * factor, max=float(self.max_loss_scale))
                state.unclamped_scale.copy_(unclamped)
                state.scale.copy_(torch.clamp(unclamped, min=float(self.min_loss_scale)))
                reset = halve | double
                zero = torch.zeros_like(steps)
                state.steps_since_rescale.copy_(torch.where(reset, zero, steps))
                state.overflows_since_rescale.copy_(torch.where(reset, zero, overflows))
                state.num_skipped_steps.add_(found.to(torch.int64))
                state.last_isfinite.copy_(~found)
                state.found_inf.zero_()
        for optimizer in _as_list(optimizers):
            self._unscaled.pop(id(optimizer), None)
        self._unscaled.clear()

    def update(self, new_scale=None):
        """torch's spelling: `update_scale` of the optimizers stepped since the last update,
        or set the scale to `new_scale` (dynamic scaling; it restarts the counters)."""
        if new_scale is None:
            self.update_scale(list(self._unscaled.values()))
            return
        if not self.dynamic:
            raise ValueError("update(new_scale) sets the scale of dynamic loss scaling; this "
                             "GradScaler has a constant scale")
        state = self._state
        self._updated = True
        with torch.no_grad():
            value = torch.as_tensor(new_scale, dtype=torch.float32)
            unclamped = torch.clamp(value, max=float(self.max_loss_scale))
            state.unclamped_scale.copy_(unclamped)
            state.scale.copy_(torch.clamp(unclamped, min=float(self.min_loss_scale)))
            state.steps_since_rescale.zero_()
            state.overflows_since_rescale.zero_()
            state.found_inf.zero_()
        self._unscaled.clear()

    def get_scale(self):
        """The current loss scale: a 0-d float32 tensor of the run's state with dynamic
        scaling, the constant (a float) otherwise."""
        return self._state.scale if self.dynamic else self._static_scale

    def get_non_clamped_scale(self):
        """The scale dynamic scaling asked for before it was raised to `min_loss_scale`:
        below `get_scale()`, scaling is not recovering from overflows."""
        return self._state.unclamped_scale if self.dynamic else self._static_scale

    def get_num_skipped_steps(self) -> torch.Tensor:
        """How many steps were skipped for non-finite gradients (a 0-d int64 tensor)."""
        return self._state.num_skipped_steps

    def state_dict(self, destination=None) -> dict:
        """The dynamic scaling state once a step updated it; empty before (a fresh
        scaler's state is its constructor's arguments) and for a static scaler. Entries
        go into `destination` when given."""
        out = {} if destination is None else destination
        if self.dynamic and self._updated:
            state = self._state
            out.update({"scale": state.scale, "unclamped_scale": state.unclamped_scale,
                        "steps_since_rescale": state.steps_since_rescale,
                        "overflows_since_rescale": state.overflows_since_rescale,
                        "num_skipped_steps": state.num_skipped_steps})
        return out

    def load_state_dict(self, state_dict: dict):
        """Restore what `state_dict()` returned (an empty dict leaves the scaler as is)."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"GradScaler.load_state_dict expects a dict, got "
                            f"{type(state_dict).__name__}")
        if not state_dict:
            return
        if not self.dynamic:
            raise ValueError("this GradScaler has a constant scale; it cannot load the state "
                             f"of dynamic loss scaling ({sorted(state_dict)})")
        state = self._state
        with torch.no_grad():
            for key in ("scale", "unclamped_scale", "steps_since_rescale",
                        "overflows_since_rescale", "num_skipped_steps"):
                if key in state_dict:
                    buffer = getattr(state, key)
                    buffer.copy_(torch.as_tensor(state_dict[key], dtype=buffer.dtype))
            if "scale" in state_dict and "unclamped_scale" not in state_dict:
                state.unclamped_scale.copy_(state.scale)
        self._updated = True


def _as_list(optimizers) -> list:
    if isinstance(optimizers, torch.optim.Optimizer):
        return [optimizers]
    return list(optimizers)


def _stepped_tensors(optimizer) -> list:
    """Every tensor an optimizer step may write: parameters, per-parameter state and a
    group's global step (other tensor-valued group entries are hyperparameters, which a
    step reads only)."""
    seen, out = set(), []
    for group in optimizer.param_groups:
        for value in [*group["params"], group.get("step")]:
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen.add(id(value))
                out.append(value)
    for per_param in optimizer.state.values():
        for value in per_param.values():
            if isinstance(value, torch.Tensor) and id(value) not in seen:
                seen.add(id(value))
                out.append(value)
    return out


def clip_grad_norm_(optimizers, max_norm: float):
    """Scale the gradients of `optimizers`' parameters so their global L2 norm is at most
    `max_norm` (written with plain tensor ops, so it lowers inside a traced step)."""
    grads = [p.grad for opt in _as_list(optimizers) for g in opt.param_groups
             for p in g["params"] if p.grad is not None]
    if not grads:
        return
    total = torch.sqrt(sum((g.float() ** 2).sum() for g in grads))
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))


def clip_grad_value_(optimizer, max_value: float):
    for g in optimizer.param_groups:
        for p in g["params"]:
            if p.grad is not None:
                p.grad.clamp_(-max_value, max_value)


def _check_number(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, Number)
                              or not value > 0):
        raise TypeError(f"optimizer_step: {name} must be a positive number or None, got "
                        f"{value!r}")


def optimizer_step(loss: torch.Tensor, optimizer, grad_scaler: GradScaler,
                   max_gradient_norm: float | None = None,
                   max_gradient_value: float | None = None):
    """The loss-scaled step in one call: backward of the scaled loss, unscale and check the
    gradients, clip them (by global norm `max_gradient_norm`, by default the scaler's, or
    by value `max_gradient_value`, not both), step the optimizer where they are finite and
    update the scale."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"optimizer_step: loss must be the loss tensor, got "
                        f"{type(loss).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer_step: optimizer must be a cstorch.optim.Optimizer (a "
                        f"torch.optim.Optimizer), got {type(optimizer).__name__}")
    if not isinstance(grad_scaler, GradScaler):
        raise TypeError(f"optimizer_step: grad_scaler must be a cstorch.amp.GradScaler, got "
                        f"{type(grad_scaler).__name__}; pass cstorch.amp.GradScaler() for no "
                        f"loss scaling, or GradScaler(loss_scale=\"dynamic\")")
    _check_number("max_gradient_norm", max_gradient_norm)
    _check_number("max_gradient_value", max_gradient_value)
    if max_gradient_norm is not None and max_gradient_value is not None:
        raise ValueError("clip gradients by norm or by value, not both: pass only one of "
                         "max_gradient_norm and max_gradient_value")
    grad_scaler.scale(loss).backward()
    if max_gradient_norm is None and max_gradient_value is None:
        grad_scaler.clip_gradients_and_return_isfinite([optimizer])
    else:
        grad_scaler.unscale_(optimizer)
        if max_gradient_norm is not None:
            clip_grad_norm_([optimizer], max_gradient_norm)
        else:
            clip_grad_value_(optimizer, max_gradient_value)
    grad_scaler.step_if_finite(optimizer)
    grad_scaler.update_scale([optimizer])

