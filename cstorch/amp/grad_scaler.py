"""`cstorch.amp.GradScaler`: loss scaling decided on the device, inside a traced step.

torch's `GradScaler` reads `found_inf` on the host to decide whether to skip the optimizer
step, which a compiled step cannot do. Here every decision is a tensor: the step always
runs, and where the gradients were not finite its results are replaced by the values from
before it (parameters and optimizer state), so a skipped step leaves them as they were.
The scale and the count of good steps are state of the run (``grad_scaler.scale``,
``grad_scaler.growth_tracker``), updated in the program.
"""
import warnings
from numbers import Number
from typing import Optional, Union

import torch

from cstorch.backend import current_or_cpu_backend

_DYNAMIC_DEFAULTS = {"init_scale": 2.0 ** 15, "steps_per_increase": 2000,
                     "min_loss_scale": 2.0 ** -14, "max_loss_scale": 2.0 ** 15}


class _ScalerState(torch.nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.register_buffer("scale", torch.tensor(float(scale), dtype=torch.float32))
        self.register_buffer("growth_tracker", torch.tensor(0, dtype=torch.int32))
        # The scale before clamping to [min_loss_scale, max_loss_scale]: below the clamped
        # one, dynamic scaling is not recovering.
        self.register_buffer("unclamped_scale", torch.tensor(float(scale), dtype=torch.float32))
        self.register_buffer("found_inf", torch.tensor(False))


class GradScaler:
    """Loss scaling for mixed precision training, used as torch's `GradScaler` is:
    ``scaler.scale(loss).backward()``, optionally ``scaler.unscale_(optimizer)`` and
    gradient clipping, ``scaler.step(optimizer)``, then ``scaler.update()``.

    `loss_scale`: "dynamic" for dynamic loss scaling, a number for a constant scale, or
    None for no scaling (a scale of 1). With dynamic scaling the scale starts at
    `init_scale` (2**15), is halved after a step whose gradients hold an inf or NaN (that
    step is skipped: parameters and optimizer state keep their values) and doubled after
    `steps_per_increase` (2000) good steps in a row, always kept within
    [`min_loss_scale`, `max_loss_scale`] (2**-14, 2**15). `max_gradient_norm`, when given,
    clips the unscaled gradients to that global norm before the optimizer step.
    `overflow_tolerance` (a fraction of steps allowed to overflow without lowering the
    scale) is not supported here: any other value than 0 is refused. With several
    optimizers, a non-finite gradient of any of them skips the step of each optimizer
    stepped after it was unscaled (torch's scaler decides per optimizer).
    """

    def __init__(self, loss_scale: Optional[Union[str, float]] = None,
                 init_scale: Optional[float] = None, steps_per_increase: Optional[int] = None,
                 min_loss_scale: Optional[float] = None, max_loss_scale: Optional[float] = None,
                 overflow_tolerance: float = 0.0, max_gradient_norm: Optional[float] = None):
        if loss_scale == "dynamic":
            self.dynamic = True
        elif loss_scale is None or (isinstance(loss_scale, Number)
                                    and not isinstance(loss_scale, bool) and loss_scale > 0):
            self.dynamic = False
        else:
            raise ValueError(f"loss_scale must be \"dynamic\", a positive number or None, got "
                             f"{loss_scale!r}")
        if overflow_tolerance != 0.0:
            raise NotImplementedError(
                "overflow_tolerance other than 0 is not supported: every step with a "
                "non-finite gradient lowers the loss scale here; leave it at 0.0")
        if max_gradient_norm is not None and not max_gradient_norm > 0:
            raise ValueError(f"max_gradient_norm must be positive, got {max_gradient_norm!r}")
        if self.dynamic:
            given = {"init_scale": init_scale, "steps_per_increase": steps_per_increase,
                     "min_loss_scale": min_loss_scale, "max_loss_scale": max_loss_scale}
            settings = {k: _DYNAMIC_DEFAULTS[k] if v is None else v for k, v in given.items()}
            for k in ("init_scale", "min_loss_scale", "max_loss_scale"):
                if not isinstance(settings[k], Number) or not settings[k] > 0:
                    raise ValueError(f"{k} must be a positive number, got {settings[k]!r}")
            steps = settings["steps_per_increase"]
            if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
                raise ValueError(f"steps_per_increase must be a positive int, got {steps!r}")
            if settings["min_loss_scale"] > settings["max_loss_scale"]:
                raise ValueError(f"min_loss_scale {settings['min_loss_scale']} is above "
                                 f"max_loss_scale {settings['max_loss_scale']}")
            self.init_scale = float(settings["init_scale"])
            self.steps_per_increase = steps
            self.min_loss_scale = float(settings["min_loss_scale"])
            self.max_loss_scale = float(settings["max_loss_scale"])
        else:
            unused = [k for k, v in (("init_scale", init_scale),
                                     ("steps_per_increase", steps_per_increase),
                                     ("min_loss_scale", min_loss_scale),
                                     ("max_loss_scale", max_loss_scale)) if v is not None]
            if unused:
                warnings.warn(f"GradScaler: {', '.join(unused)} only apply to "
                              f"loss_scale=\"dynamic\" and are ignored", stacklevel=2)
            self.init_scale = 1.0 if loss_scale is None else float(loss_scale)
        self.loss_scale = loss_scale
        self.max_gradient_norm = max_gradient_norm
        self.growth_factor, self.backoff_factor = 2.0, 0.5
        self._state = _ScalerState(self._clamp(self.init_scale))
        self._state.unclamped_scale.fill_(self.init_scale)
        backend = current_or_cpu_backend()
        self.name = backend.state.add_holder("grad_scaler", self._state)
        self._unscaled: set = set()   # ids of optimizers unscaled since the last update

    def _clamp(self, value: float) -> float:
        if not self.dynamic:
            return value
        return min(max(value, self.min_loss_scale), self.max_loss_scale)

    # the torch GradScaler protocol -------------------------------------------------------
    def scale(self, outputs):
        """`outputs` (a tensor, or a structure of them) times the current loss scale."""
        if isinstance(outputs, torch.Tensor):
            return outputs * self._state.scale   # dtype promotion as in torch
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if isinstance(outputs, dict):
            return {k: self.scale(v) for k, v in outputs.items()}
        raise TypeError(f"GradScaler.scale expects tensors, got {type(outputs).__name__}")

    def unscale_(self, optimizer):
        """Divide the gradients of `optimizer`'s parameters by the loss scale, in place,
        and note whether any is not finite. At most once per optimizer between updates."""
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update(); call it once per optimizer and step")
        self._unscaled.add(id(optimizer))
        inverse = self._state.scale.double().reciprocal().float()
        found = self._state.found_inf
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                found = found | ~torch.isfinite(p.grad).all()
                p.grad.mul_(inverse.to(p.grad.dtype))
        self._state.found_inf.copy_(found)

    def step(self, optimizer, *args, **kwargs):
        """Unscale (unless done) and clip the gradients, then step `optimizer`; where the
        gradients were not finite the step leaves parameters and optimizer state as they
        were."""
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if self.max_gradient_norm is not None:
            clip_grad_norm_(optimizer, self.max_gradient_norm)
        before = [(t, t.detach().clone()) for t in _stepped_tensors(optimizer)]
        result = optimizer.step(*args, **kwargs)
        skip = self._state.found_inf
        with torch.no_grad():
            for tensor, old in before:
                tensor.copy_(torch.where(skip, old, tensor))
        return result

    def update(self, new_scale=None):
        """Update the scale after the optimizers have stepped: halved after a step with
        non-finite gradients, doubled after `steps_per_increase` good steps in a row
        (dynamic scaling only); or set to `new_scale`."""
        state = self._state
        with torch.no_grad():
            if new_scale is not None:
                value = float(new_scale)
                state.unclamped_scale.fill_(value)
                state.scale.fill_(self._clamp(value))
                state.growth_tracker.zero_()
            elif self.dynamic:
                found = state.found_inf
                good = state.growth_tracker + 1
                grow = ~found & (good >= self.steps_per_increase)
                unclamped = torch.where(found, state.scale * self.backoff_factor,
                                        torch.where(grow, state.scale * self.growth_factor,
                                                    state.scale))
                state.unclamped_scale.copy_(unclamped)
                state.scale.copy_(unclamped.clamp(self.min_loss_scale, self.max_loss_scale))
                state.growth_tracker.copy_(torch.where(found | grow, torch.zeros_like(good),
                                                       good))
            state.found_inf.zero_()
        self._unscaled.clear()

    def get_scale(self) -> torch.Tensor:
        """The current loss scale (a 0-d tensor of the run's state)."""
        return self._state.scale

    def get_non_clamped_scale(self) -> torch.Tensor:
        """The scale dynamic scaling asked for before it was kept within [min_loss_scale,
        max_loss_scale]: below `get_scale()`, scaling is not recovering from overflows."""
        return self._state.unclamped_scale

    def state_dict(self) -> dict:
        return {"scale": self._state.scale, "growth_tracker": self._state.growth_tracker,
                "unclamped_scale": self._state.unclamped_scale}

    def load_state_dict(self, state_dict: dict):
        with torch.no_grad():
            self._state.scale.copy_(torch.as_tensor(state_dict["scale"], dtype=torch.float32))
            self._state.growth_tracker.copy_(
                torch.as_tensor(state_dict["growth_tracker"], dtype=torch.int32))
            unclamped = state_dict.get("unclamped_scale", state_dict["scale"])
            self._state.unclamped_scale.copy_(torch.as_tensor(unclamped, dtype=torch.float32))


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


def clip_grad_norm_(optimizer, max_norm: float):
    """Scale the gradients of `optimizer`'s parameters so their global L2 norm is at most
    `max_norm` (written with plain tensor ops, so it lowers inside a traced step)."""
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
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


def optimizer_step(loss: torch.Tensor, optimizer, grad_scaler: GradScaler,
                   max_gradient_norm: Optional[float] = None,
                   max_gradient_value: Optional[float] = None):
    """The usual loss-scaled step in one call: scaled backward, unscale, optional clipping
    by global norm or by value (not both), optimizer step, scaler update."""
    if max_gradient_norm is not None and max_gradient_value is not None:
        raise ValueError("clip gradients by norm or by value, not both: pass only one of "
                         "max_gradient_norm and max_gradient_value")
    grad_scaler.scale(loss).backward()
    grad_scaler.unscale_(optimizer)
    if max_gradient_norm is not None:
        clip_grad_norm_(optimizer, max_gradient_norm)
    elif max_gradient_value is not None:
        clip_grad_value_(optimizer, max_gradient_value)
    grad_scaler.step(optimizer)
    grad_scaler.update()
