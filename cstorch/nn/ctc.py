"""The CTC loss written with static-shape tensor ops, for traced steps.

PyTorch's `ctc_loss` kernel sizes its work by the target lengths' values, which a
compiled step cannot have. This is the same forward (alpha) recursion of Graves et al.
(2006) over every time step and every position of the longest possible target, with the
lengths applied as masks, so its shapes depend on the inputs' shapes only; autograd
differentiates it like any other op. Where no alignment is possible (a target longer
than its input allows) the loss is infinite, as PyTorch's is, but that sample's gradient
is 0 where PyTorch's is NaN (as with `zero_infinity`, which also zeroes the loss).
"""
import torch

# A finite stand-in for log(0): exp of it is 0, and unlike -inf it leaves no NaN in the
# gradient of a log-sum-exp over impossible paths. A loss beyond _IMPOSSIBLE is infinite.
_LOG_ZERO = -1e30
_IMPOSSIBLE = 1e29


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
             zero_infinity=False):
    """`torch.nn.functional.ctc_loss`, same arguments and values."""
    unbatched = log_probs.dim() == 2
    if unbatched:
        log_probs = log_probs.unsqueeze(1)
        targets = targets.unsqueeze(0) if targets.dim() == 1 else targets
    steps, batch, _ = log_probs.shape
    input_lengths = torch.as_tensor(input_lengths).reshape(batch).long()
    target_lengths = torch.as_tensor(target_lengths).reshape(batch).long()
    # Labels past a target's length are never read; clamped, padding of any value can be
    # gathered.
    targets = targets.long().clamp(0, log_probs.shape[2] - 1)
    if targets.dim() == 1:
        targets = _padded(targets, target_lengths)
    width = 2 * targets.shape[1] + 1

    # The targets with a blank before, between and after their labels.
    extended = torch.full((batch, width), blank, dtype=torch.long, device=targets.device)
    extended[:, 1::2] = targets
    # A label may be reached from two positions back when it differs from that one (the
    # blank between them may then be skipped).
    skip = torch.zeros((batch, width), dtype=torch.bool, device=targets.device)
    skip[:, 2:] = (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])

    emissions = torch.gather(log_probs.permute(1, 0, 2), 2,
                             extended.unsqueeze(1).expand(batch, steps, width))
    position = torch.arange(width, device=log_probs.device)
    log_zero = torch.full((batch, width), _LOG_ZERO, dtype=log_probs.dtype,
                          device=log_probs.device)
    alpha = torch.where(position < 2, emissions[:, 0], log_zero)
    for t in range(1, steps):
        one_back = torch.cat([log_zero[:, :1], alpha[:, :-1]], 1)
        two_back = torch.where(skip, torch.cat([log_zero[:, :2], alpha[:, :-2]], 1), log_zero)
        step = torch.logsumexp(torch.stack([alpha, one_back, two_back]), 0) + emissions[:, t]
        alpha = torch.where((t < input_lengths).unsqueeze(1), step, alpha)

    last = (2 * target_lengths).unsqueeze(1)
    ends = torch.cat([torch.gather(alpha, 1, last),
                      torch.where(last > 0, torch.gather(alpha, 1, (last - 1).clamp(min=0)),
                                  log_zero[:, :1])], 1)
    loss = -torch.logsumexp(ends, 1)
    impossible = loss > _IMPOSSIBLE
    if zero_infinity:
        loss = torch.where(impossible, torch.zeros_like(loss), loss)
    else:
        loss = torch.where(impossible, torch.full_like(loss, float("inf")), loss)
    if reduction == "mean":
        return (loss / target_lengths.clamp(min=1).to(loss.dtype)).mean()
    if reduction == "sum":
        return loss.sum()
    return loss.squeeze(0) if unbatched else loss


def _padded(concatenated, lengths):
    """Targets given as one concatenated vector, as rows padded to the vector's length
    (the longest any one target can be)."""
    total = concatenated.shape[0]
    starts = torch.cumsum(lengths, 0) - lengths
    index = starts.unsqueeze(1) + torch.arange(total, device=concatenated.device)
    return concatenated[index.clamp(max=max(total - 1, 0))] if total else \
        concatenated.reshape(lengths.shape[0], 0)
