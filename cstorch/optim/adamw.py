"""`cstorch.optim.AdamW`: Adam with decoupled weight decay."""
from cstorch.optim.AdamBase import AdamBase
from cstorch.optim.optimizer import ParamsT


class AdamW(AdamBase):
    """Adam with weight decay applied to the parameters directly (Loshchilov & Hutter).

    ``correct_bias=False`` drops the bias correction (as BERT's original optimizer does) and
    with it the ``beta1_power``/``beta2_power`` state.
    """

    def __init__(self, params: ParamsT, lr: float = 0.001, betas=(0.9, 0.999), eps=1e-06,
                 weight_decay=0.0, correct_bias=True, amsgrad=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         l2_regularization_rate=0.0, correct_bias=correct_bias, amsgrad=amsgrad)
