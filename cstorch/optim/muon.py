"""`cstorch.optim.Muon`: momentum orthogonalised by Newton-Schulz (Jordan et al., 2024)."""
import torch

from cstorch.optim import _update as U
from cstorch.optim.optimizer import ParamsT

# The quintic Newton-Schulz iteration of the Muon write-up: coefficients chosen for the
# largest slope at zero, so a few steps push every singular value near 1 (roughly
# into [0.5, 1.5], not exactly 1), which is all the update needs.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def orthogonalize(matrix: torch.Tensor, steps: int) -> torch.Tensor:
    """Approximate ``U @ V.T`` of ``matrix = U S V.T`` by `steps` quintic Newton-Schulz
    iterations, ``X <- a X + (b A + c A @ A) X`` with ``A = X @ X.T``, starting from the
    matrix scaled to Frobenius norm (at most) 1. A tall matrix is iterated transposed, so
    ``A`` is the smaller Gram matrix."""
    a, b, c = NS_COEFFICIENTS
    x = matrix / (matrix.norm() + NS_EPS)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.t()
    for _ in range(steps):
        gram = x @ x.t()
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.t() if tall else x


class Muon(U.ElementwiseOptimizer):
    """Muon: SGD with momentum whose update of each weight matrix is replaced by the
    nearest (semi-)orthogonal matrix, found by Newton-Schulz iteration.

    Per step, for a parameter ``p`` with gradient ``g`` and ``momentum_buffer`` ``m``:
    ``m = momentum * m + (1 - momentum) * g``; the update is ``u = (1 - momentum) * g +
    momentum * m`` with ``nesterov`` (else ``u = m``); ``O`` is `orthogonalize` of ``u``
    (a parameter of more than 2 dimensions, a convolution's filters, as the matrix
    ``u.reshape(p.shape[0], -1)``) with ``ns_steps`` iterations; then decoupled weight
    decay ``p *= 1 - lr * weight_decay`` and ``p -= lr * sqrt(max(1, rows / cols)) * O``.

    Muon is meant for the hidden weight matrices of a network; embeddings, the output
    layer, biases and gains belong with another optimizer (AdamW, say). A step that would
    update a parameter of fewer than 2 dimensions raises ValueError: it has no matrix to
    orthogonalise. The iteration runs in the parameter's dtype.
    """

    coupled_weight_decay = False

    def __init__(self, params: ParamsT, lr: float = 0.02, weight_decay=0.01, momentum=0.95,
                 nesterov=True, ns_steps=5):
        U.check("learning rate", lr)
        U.check("weight_decay value", weight_decay)
        U.check("momentum value", momentum, high=1.0, strict_high=True)
        if isinstance(ns_steps, bool) or not isinstance(ns_steps, int) or ns_steps < 0:
            raise ValueError(f"Invalid ns_steps: {ns_steps!r} (a number of Newton-Schulz "
                             f"iterations, an int >= 0)")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      nesterov=nesterov, ns_steps=ns_steps))

    def init_state(self, p, group):
        return {"momentum_buffer": torch.zeros_like(p)}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Checked before any parameter moves, so a refused step changes nothing.
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and p.dim() < 2:
                    raise ValueError(
                        f"Muon orthogonalises weight matrices; a parameter of shape "
                        f"{tuple(p.shape)} has fewer than 2 dimensions. Optimize biases, "
                        f"gains and other vectors with another optimizer (AdamW, say).")
        super().step()
        return loss

    def update(self, p, grad, group, state):
        momentum, lr = group["momentum"], group["lr"]
        buf = state["momentum_buffer"]
        U.ema_(buf, grad, momentum)
        if group["nesterov"]:
            update = U.add_scaled(U.scale(grad, U.one_minus(momentum)), buf, momentum)
        else:
            update = buf
        matrix = update.reshape(p.shape[0], -1)
        rows, cols = matrix.shape
        direction = orthogonalize(matrix, group["ns_steps"]).reshape(p.shape)
        U.decay_weights(p, lr, group["weight_decay"])
        U.subtract_scaled(p, direction, U.scale(lr, max(1.0, rows / cols) ** 0.5))
