"""One family of the Model Zoo catalogue trained under `@cstorch.trace` and eagerly, side by
side: the measurements a parity test asserts on and `docs/modelzoo.md` tabulates.

The traced run is Model Zoo's loop: compile, optimizer on the compiled module's parameters,
one traced step (forward with the model's own loss, zero_grad, backward, step) driven by a
DataExecutor. The reference is the same model (built again from the same seed) trained
eagerly by torch: `torch.optim.SGD`, or for AdamW the same `cstorch.optim.AdamW` stepping
eagerly on the host parameters of the uncompiled copy.
"""
import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import cerebras.pytorch as cstorch
from tests.modelzoo.common import loader, max_rel
from tests.modelzoo.families import FAMILIES

ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-5, weight_decay=0.1, correct_bias=True)


def make_optimizers(name, sgd_lr):
    """(traced optimizer factory, eager reference optimizer factory)."""
    if name == "sgd":
        return (lambda params: cstorch.optim.SGD(params, lr=sgd_lr),
                lambda params: torch.optim.SGD(params, lr=sgd_lr))
    if name == "adamw":
        make = (lambda params: cstorch.optim.AdamW(params, **ADAMW))
        return make, make
    raise ValueError(f"optimizer {name!r}: expected 'sgd' or 'adamw'")


def _trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


class WaferHalfProducts(TorchFunctionMode):
    """The eager reference for a CSX run of code that feeds half activations to float32
    layers (Model Zoo's mixture-of-experts block under `cstorch.use_cs()`), which eager
    PyTorch refuses: `F.linear` with its float32 weight and bias rounded to the
    activations' dtype by hand, as a CSX compile takes the product (under autocast,
    autocast rounds them itself). `rounded` counts the products it changed."""

    def __init__(self):
        super().__init__()
        self.rounded = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and args[0].dtype in (torch.float16, torch.bfloat16) \
                and args[1].dtype == torch.float32 and not torch.is_autocast_enabled("cpu"):
            half = args[0].dtype
            args = (args[0], *(a.to(half) if isinstance(a, torch.Tensor) else a
                               for a in args[1:]))
            kwargs = {k: v.to(half) if isinstance(v, torch.Tensor) else v
                      for k, v in kwargs.items()}
            self.rounded += 1
        return func(*args, **kwargs)


def train_traced(family, model, make_optimizer, batches, backend):
    compiled = cstorch.compile(model, backend)
    optimizer = make_optimizer(_trainable(model))

    @cstorch.trace
    def training_step(batch):
        loss = family.compute_loss(compiled, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    executor = cstorch.utils.data.DataExecutor(loader(batches), num_steps=len(batches))
    losses = [training_step(batch) for batch in executor]
    assert training_step.captures == 1
    return [float(loss) for loss in losses]


def train_eager(family, model, optimizer, batches):
    losses = []
    for batch in batches:
        loss = family.compute_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def run(name, optimizer, steps, backend_kind="CPU", artifact_dir=None):
    """Train family `name` `steps` steps both ways; returns the losses, the final states
    and the initial state (all as float64 numpy arrays keyed by state-dict name)."""
    family = FAMILIES[name]
    make_traced, make_eager = make_optimizers(optimizer, family.sgd_lr)
    with family.precision():
        # built twice from one seed: a deep copy fails on weight-normed layers (DINO's
        # heads hold the normalised weight as a non-leaf tensor)
        model, reference = family.build(), family.build()
        initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.train()
        reference.train()
        batches = family.batches(steps, 1)
        kwargs = {"artifact_dir": artifact_dir} if artifact_dir else {}
        backend = cstorch.backend(backend_kind, **kwargs)
        wafer_products = WaferHalfProducts()
        with wafer_products if backend_kind == "CSX" else contextlib.nullcontext():
            ref_losses = train_eager(family, reference, make_eager(_trainable(reference)),
                                     batches)
        losses = train_traced(family, model, make_traced, batches, backend)
    return {"losses": losses, "ref_losses": ref_losses, "rounded": wafer_products.rounded,
            "state": _numpy(model.state_dict()), "ref_state": _numpy(reference.state_dict()),
            "initial": _numpy(initial)}


def _numpy(state):
    return {k: np.asarray(v.detach().float().cpu().numpy(), dtype=np.float64)
            for k, v in state.items() if v.is_floating_point()}


def noise_keys(name, state):
    """The family's parameters whose gradient is float32 rounding noise: AdamW scales a
    noise gradient of 1e-8 up to a step of lr * 1e-8 / (1e-8 + eps), noise too, so only
    the bound on an AdamW step (lr per step) holds between two runs."""
    return [k for k in state if k.endswith(FAMILIES[name].noise_gradients)] \
        if FAMILIES[name].noise_gradients else []


def measure(name, result):
    """Worst relative differences: losses (elementwise), parameters (max |a - e| over the
    tensor's largest value, the worst tensor named); the largest absolute difference in
    the parameters of noise gradients; and which parameters moved."""
    losses, ref = np.asarray(result["losses"]), np.asarray(result["ref_losses"])
    loss_rel = float(np.max(np.abs(losses - ref) / np.maximum(np.abs(ref), 1e-30)))
    state, ref_state, initial = result["state"], result["ref_state"], result["initial"]
    assert sorted(state) == sorted(ref_state)
    noise = noise_keys(name, ref_state)
    worst = max((max_rel(state[k], ref_state[k]), k) for k in ref_state if k not in noise)
    noise_abs = max([float(np.max(np.abs(state[k] - ref_state[k]))) for k in noise],
                    default=0.0)
    moved = [k for k in ref_state if max_rel(ref_state[k], initial[k]) > 1e-3]
    return {"loss_rel": loss_rel, "param_rel": worst[0], "param_key": worst[1],
            "rounded_products": result.get("rounded", 0),
            "noise_abs": noise_abs, "moved": len(moved), "params": len(ref_state),
            "finite": bool(np.isfinite(ref).all())}
