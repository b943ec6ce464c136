"""Update machinery the cstorch optimizers share.

Every rule here works on plain torch tensors with in-place ops, so one implementation
serves eager steps and traced ones: in a traced step the state tensors are the traced
stand-ins and their in-place updates become the step's new state. Hyperparameters may be
floats or tensors: a scheduler writes a tensor ``lr`` into each param group, and a traced
step receives every nonzero float hyperparameter (and each nonzero float of a tuple such as
``betas``) as a 0-d float32 tensor, whose value is unknown while the step is traced. A
hyperparameter that is 0 stays the Python number, so it may still decide the structure of
a step. Hence the rules below never branch on a hyperparameter's value unless it is a
number (`is_set`), and never hand a tensor hyperparameter to an argument torch reads as a
Python number (``alpha=``, ``value=``, mixed tensor/number clamp bounds, ``math``
functions): the helpers here take either, using the plain scalar form for numbers (so
float hyperparameters give exactly the results they always did) and tensor arithmetic for
tensors.
"""
import contextvars
from abc import abstractmethod

import torch
import torch.utils._pytree as pytree

from bridge import copied_updates
from cstorch.optim.optimizer import Optimizer


def counter() -> torch.Tensor:
    """A fresh step counter. A float32 tensor, so it can live in the traced state and be
    mixed into float arithmetic directly; it counts exactly up to 2**24 steps."""
    return torch.tensor(0.0)


# A traced step receives each nonzero float hyperparameter as a float32 scalar together with
# its complement ``1 - x`` computed in double precision: float32(0.999) is off by 1.3e-8,
# but 1 - float32(0.999) by 1.3e-5 relative, an error moving averages would carry.
complements = contextvars.ContextVar("cstorch_hyper_complements", default=None)


def one_minus(x):
    """``1 - x`` for a hyperparameter: a traced one's complement as computed on the host."""
    if isinstance(x, torch.Tensor):
        table = complements.get()
        if table is not None and id(x) in table:
            return table[id(x)]
    return 1 - x


def one_minus_f32(x):
    """``1 - x`` rounded as float32 arithmetic rounds it (``1 - float32(0.999)`` is off by
    1.3e-5 relative): the complement some of the real package's optimizers use, which
    their recorded state follows."""
    if isinstance(x, torch.Tensor):
        return 1 - x
    return float(1 - torch.tensor(x, dtype=torch.float32))


def is_set(x) -> bool:
    """Whether hyperparameter `x` takes effect: always for a tensor (its value may be a
    traced one, and a zero hyperparameter would have stayed a number), else ``x != 0``."""
    return True if isinstance(x, torch.Tensor) else x != 0


def scale(x, factor):
    """``x * factor`` for a float or tensor `factor`."""
    return x * factor


def subtract_scaled(p, update, factor):
    """``p -= factor * update`` in place, `factor` a float or a tensor."""
    if isinstance(factor, torch.Tensor):
        p.sub_(update * factor)
    else:
        p.add_(update, alpha=-factor)


# With a tensor factor the helpers below use ``addcmul`` against the 0-d factor, which
# rounds as ``add(alpha=...)`` and ``addcmul(value=...)`` do with a float one (one fused
# multiply-add on CPU), so eager results with a float32 tensor hyperparameter equal those
# with the same float bit for bit.

def add_scaled(x, y, factor):
    """``x + factor * y`` as a new tensor, `factor` a float or a tensor."""
    if isinstance(factor, torch.Tensor):
        return torch.addcmul(x, y, factor)
    return x.add(y, alpha=factor)


def add_scaled_(x, y, factor):
    """``x += factor * y`` in place, `factor` a float or a tensor."""
    if isinstance(factor, torch.Tensor):
        return x.addcmul_(y, factor)
    return x.add_(y, alpha=factor)


def add_product_(x, a, b, factor):
    """``x += factor * a * b`` in place (`addcmul_`), `factor` a float or a tensor."""
    if isinstance(factor, torch.Tensor):
        return x.addcmul_(a * factor, b)
    return x.addcmul_(a, b, value=factor)


def clamp(x, low=None, high=None):
    """``torch.clamp(x, low, high)`` where either bound may be a number, a tensor or None.

    torch takes both bounds as numbers or both as tensors; one bound at a time takes a mix
    (and gives the same values, also when ``low > high``)."""
    if not isinstance(low, torch.Tensor) and not isinstance(high, torch.Tensor):
        return torch.clamp(x, low, high)
    if low is not None:
        x = torch.clamp(x, min=low)
    if high is not None:
        x = torch.clamp(x, max=high)
    return x


def full_like(x, value):
    """``torch.full_like(x, value)`` for a float or 0-d tensor `value` (torch would read a
    tensor's value as a Python number)."""
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(x) + value
    return torch.full_like(x, value)


def decay_weights(p, lr, weight_decay):
    """Decoupled weight decay: ``p *= 1 - lr * weight_decay``."""
    if is_set(weight_decay):
        p.mul_(1 - lr * weight_decay)


def ema_(avg, value, beta, complement=one_minus):
    """``avg = beta * avg + (1 - beta) * value`` in place, ``1 - beta`` as `complement`
    gives it."""
    add_scaled_(avg.mul_(beta), value, complement(beta))


def ema_sq_(avg, value, beta, complement=one_minus):
    """``avg = beta * avg + (1 - beta) * value**2`` in place, ``1 - beta`` as
    `complement` gives it."""
    add_product_(avg.mul_(beta), value, value, complement(beta))


def check(name, value, low=0.0, high=None, strict_high=False):
    """Validate a hyperparameter the way torch's optimizers do."""
    if isinstance(value, torch.Tensor):
        return
    if value < low or (high is not None and (value >= high if strict_high else value > high)):
        raise ValueError(f"Invalid {name}: {value}")


def check_betas(betas):
    """Both Adam-style decay rates in [0, 1)."""
    for i, beta in enumerate(betas):
        check(f"beta parameter at index {i}", beta, high=1.0, strict_high=True)


# Group forms of the rules above: one `torch._foreach_*` op updates a whole param group's
# tensors, so a traced step captures and lowers a few nodes per rule instead of a few per
# parameter. Each applies, tensor by tensor, the same ATen op as the per-tensor helper (on
# CPU a foreach op runs that op's kernel on each tensor), so results are bit for bit those of
# the per-tensor form.

def _each(factor, count):
    """A tensor `factor` repeated for a list op that takes one tensor per element."""
    return [factor] * count


def add_all_(xs, value):
    """``x += value`` for each x, `value` a float or a 0-d tensor."""
    if isinstance(value, torch.Tensor):
        # torch._foreach_add_(list, tensor) would read the tensor as a number
        torch.ops.aten._foreach_add_.Tensor(xs, value)
    else:
        torch._foreach_add_(xs, value)


def one_minus_all(xs):
    """``1 - x`` for each x, as new tensors (``-x + 1`` rounds as ``1 - x`` does)."""
    out = torch._foreach_neg(xs)
    torch._foreach_add_(out, 1)
    return out


def add_scaled_all(xs, ys, factor):
    """``x + factor * y`` for each pair, as new tensors (`add_scaled`)."""
    if isinstance(factor, torch.Tensor):
        return torch._foreach_addcmul(xs, ys, _each(factor, len(xs)))
    return torch._foreach_add(xs, ys, alpha=factor)


def add_scaled_all_(xs, ys, factor):
    """``x += factor * y`` for each pair (`add_scaled_`)."""
    if isinstance(factor, torch.Tensor):
        torch._foreach_addcmul_(xs, ys, _each(factor, len(xs)))
    else:
        torch._foreach_add_(xs, ys, alpha=factor)


def add_product_all_(xs, a, b, factor):
    """``x += factor * a * b`` for each triple (`add_product_`)."""
    if isinstance(factor, torch.Tensor):
        torch._foreach_addcmul_(xs, torch._foreach_mul(a, factor), b)
    else:
        torch._foreach_addcmul_(xs, a, b, value=factor)


def ema_all_(avgs, values, beta):
    """`ema_` for each pair."""
    torch._foreach_mul_(avgs, beta)
    add_scaled_all_(avgs, values, one_minus(beta))


def ema_sq_all_(avgs, values, beta):
    """`ema_sq_` for each pair."""
    torch._foreach_mul_(avgs, beta)
    add_product_all_(avgs, values, values, one_minus(beta))


def decay_weights_all(ps, lr, weight_decay):
    """`decay_weights` for each parameter."""
    if is_set(weight_decay):
        torch._foreach_mul_(ps, 1 - lr * weight_decay)


def l2_regularize_all(grads, ps, rate):
    """The gradients of an added ``rate / 2 * |p|^2`` term, folded into `grads`."""
    return add_scaled_all(grads, ps, rate) if is_set(rate) else grads


def subtract_scaled_all(ps, updates, factor, scratch=False):
    """``p -= factor * update`` for each pair (`subtract_scaled`); `factor` a float, a
    tensor, or a sequence of one 0-d tensor per parameter. With `scratch`, `updates` are
    temporaries the product may overwrite: an in-place foreach op traces faster than one
    with new outputs."""
    if isinstance(factor, (torch.Tensor, list, tuple)):
        if scratch:
            torch._foreach_mul_(updates, factor)
        else:
            updates = torch._foreach_mul(updates, factor)
        torch._foreach_sub_(ps, updates)
    else:
        torch._foreach_add_(ps, updates, alpha=-factor)


class ElementwiseOptimizer(Optimizer):
    """An optimizer whose rule updates each parameter on its own.

    Subclasses give `init_state(p, group)` (the state of one parameter, created before
    the first step) and either `update(p, grad, group, state)`, the rule for one parameter,
    or `update_group(params, grads, group, states)`, the rule for all of a param group's
    parameters that have a gradient at once (with the group helpers above). The loop here
    runs the closure, skips parameters without a gradient, and applies ``maximize`` and
    coupled ("L2") weight decay where the optimizer's param groups have them and
    `coupled_weight_decay` says so.
    """

    coupled_weight_decay = True

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p in self.state:  # a group added later: earlier groups keep their state
                    continue
                state = self.init_state(p, group)
                if state:  # no entry at all for stateless rules, as state_dict() shows
                    self.state[p].update(state)

    @abstractmethod
    def init_state(self, p, group) -> dict:
        """The state tensors of parameter `p`, keyed as in `state_dict()`."""

    def update(self, p, grad, group, state):
        """Update `p` in place from `grad`, advancing `state` in place."""
        self.update_group([p], [grad], group, [state])

    def update_group(self, params, grads, group, states):
        """Update each of `params` in place from its gradient, advancing its state in place."""
        if type(self).update is ElementwiseOptimizer.update:
            raise NotImplementedError(f"{type(self).__name__} defines neither update() nor "
                                      f"update_group()")
        for p, grad, state in zip(params, grads, states):
            self.update(p, grad, group, state)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            if group.get("maximize", False):
                grads = torch._foreach_neg(grads)
            if self.coupled_weight_decay:
                grads = l2_regularize_all(grads, params, group.get("weight_decay", 0.0))
            # .get: a step adds no empty entry for a stateless rule (the real SGD's
            # state_dict stays empty)
            states = [self.state.get(p, {}) for p in params]
            session = copied_updates.current()
            if session is None or not all(isinstance(v, torch.Tensor)
                                          for state in states for v in state.values()):
                self.update_group(params, grads, group, states)
            else:
                self._update_copied(session, params, grads, group, states)
        return loss

    def _update_copied(self, session, params, grads, group, states):
        """`update_group` in a traced step, traced once for each kind of alike parameters
        (the same shapes and state) and copied for the others (`bridge.copied_updates`):
        each parameter's update is on its own, so a copy is the same ops."""
        def update(batch):
            ps, gs, ss = [], [], []
            for keys, tensors in batch:
                ps.append(tensors[0])
                gs.append(tensors[1])
                ss.append(dict(zip(keys, tensors[2:])))
            self.update_group(ps, gs, group, ss)
            after = []
            for (keys, _), p, g, state in zip(batch, ps, gs, ss):
                if tuple(state) != keys:
                    raise copied_updates.NotCopied(
                        f"{type(self).__name__}'s update adds or removes state "
                        f"({sorted(set(state) ^ set(keys))})")
                after.append([p, g, *state.values()])
            return after

        members = [(tuple(state), [p, g, *state.values()])
                   for p, g, state in zip(params, grads, states)]
        ids = {id(p) for p in group["params"]}
        shared = [v for v in pytree.tree_leaves(dict(group))
                  if isinstance(v, torch.Tensor) and id(v) not in ids]
        session.apply(update, members, shared)
