"""Perplexity of a language model: exp of the mean loss per (weighted) token."""
import torch

from cstorch.metrics.metric import Metric, as_tensor, weights_like


class PerplexityMetric(Metric):
    """``exp(sum of losses / sum of token weights)`` over every batch.

    Call it with `labels` (the batch's token ids: only their shape is used), `loss` (the
    batch's loss summed over its tokens, not averaged) and optionally `weights` (one per
    token, broadcastable to `labels`; by default every token counts once). Before any
    update the value is NaN (exp of 0 / 0).

    Args:
        name: the name the metric is logged and registered under (required; None
            is allowed).
    """

    def reset(self):
        self.register_state("total_loss", torch.tensor(0.0))
        self.register_state("total_num_tokens", torch.tensor(0.0))

    def update(self, labels, loss, weights=None, dtype=None):
        """Fold one batch in. `dtype` is the floating dtype the loss and weights are taken
        in (Model Zoo passes its logits' dtype); they are summed and accumulated in float32
        whatever it is."""
        dtype = dtype or torch.float32
        w = weights_like(weights, labels, dtype)
        self.total_loss.add_(as_tensor(loss, dtype).float().sum())
        self.total_num_tokens.add_(w.float().sum())

    def compute(self) -> torch.Tensor:
        return torch.exp(self.total_loss / self.total_num_tokens)
