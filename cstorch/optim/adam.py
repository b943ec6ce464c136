"""`cstorch.optim.Adam`: Adam whose weight decay is L2 regularisation of the gradient."""
from cstorch.optim import _update as U
from cstorch.optim.AdamBase import AdamBase
from cstorch.optim.optimizer import ParamsT


class Adam(AdamBase):
    """Adam (Kingma & Ba) with L2 regularisation as ``weight_decay`` and optional AMSGrad.

    Defaults follow the real package (``eps=1e-06``); the state holds ``exp_avg``,
    ``exp_avg_sq`` (and ``max_exp_avg_sq`` with amsgrad), ``beta1_power`` and
    ``beta2_power``. The param groups keep the rate as ``l2_regularization_rate`` and
    ``weight_decay`` as 0.0 (`handle_weight_decay`).
    """

    def __init__(self, params: ParamsT, lr: float = 0.001, betas=(0.9, 0.999), eps=1e-06,
                 weight_decay=0.0, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         l2_regularization_rate=0.0, correct_bias=True, amsgrad=amsgrad)

    def handle_weight_decay(self, param_groups):
        """Move each group's ``weight_decay`` to ``l2_regularization_rate`` (Adam's weight
        decay is an L2 term of the gradient) and leave ``weight_decay`` at 0.0, the
        decoupled decay that Adam does not apply. A group that already keeps its rate
        (one this class saved: ``weight_decay`` 0.0) keeps it."""
        for group in param_groups:
            rate = group.pop("weight_decay", 0.0)
            if "l2_regularization_rate" not in group or U.is_set(rate):
                group["l2_regularization_rate"] = rate
            group["weight_decay"] = 0.0

    def add_param_group(self, param_group):
        # torch's constructor adds the given groups through here too
        super().add_param_group(param_group)
        self.handle_weight_decay(self.param_groups[-1:])

    def load_state_dict(self, state_dict):
        """Load a state dict; a ``weight_decay`` in its param groups (one saved by
        `torch.optim.Adam`, say) becomes ``l2_regularization_rate``, as at construction."""
        groups = [dict(group) for group in state_dict["param_groups"]]
        self.handle_weight_decay(groups)
        super().load_state_dict(dict(state_dict, param_groups=groups))

