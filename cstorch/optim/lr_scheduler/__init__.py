"""`cerebras.pytorch.optim.lr_scheduler`: closed-form learning-rate schedules whose step
counter lives in the device state, so they advance inside a traced step. The generic
``*Scheduler`` bases of `cstorch.optim.scheduler` are exported here too
(``BaseChainedScheduler`` is `cstorch.optim.scheduler.ChainedScheduler`)."""
from cstorch.optim.scheduler import (
    Scheduler, ConstantScheduler, PolynomialScheduler, LinearScheduler, ExponentialScheduler,
    InverseExponentialTimeDecayScheduler, InverseSquareRootDecayScheduler, CosineDecayScheduler,
    CosineAnnealingScheduler, CosineAnnealingWarmRestartsScheduler, StepScheduler,
    MultiStepScheduler, MultiplicativeScheduler, LambdaScheduler, CyclicScheduler,
    OneCycleScheduler, SequentialScheduler, PiecewiseConstantScheduler, ScalePerParamScheduler)
from cstorch.optim.scheduler import ChainedScheduler as BaseChainedScheduler
from cstorch.optim.lr_scheduler.scheduler import LRScheduler
from cstorch.optim.lr_scheduler.constant import ConstantLR
from cstorch.optim.lr_scheduler.linear import LinearLR
from cstorch.optim.lr_scheduler.polynomial import PolynomialLR
from cstorch.optim.lr_scheduler.exponential import ExponentialLR
from cstorch.optim.lr_scheduler.inverse_exponential_time_decay import InverseExponentialTimeDecayLR
from cstorch.optim.lr_scheduler.inverse_square_root_decay import InverseSquareRootDecayLR
from cstorch.optim.lr_scheduler.cosine_decay import CosineDecayLR
from cstorch.optim.lr_scheduler.cosine_annealing import CosineAnnealingLR
from cstorch.optim.lr_scheduler.cosine_annealing_warm_restarts import CosineAnnealingWarmRestarts
from cstorch.optim.lr_scheduler.multi_step import MultiStepLR
from cstorch.optim.lr_scheduler.step import StepLR
from cstorch.optim.lr_scheduler.piecewise_constant import PiecewiseConstantLR
from cstorch.optim.lr_scheduler.multiplicative import MultiplicativeLR
from cstorch.optim.lr_scheduler.cyclic import CyclicLR
from cstorch.optim.lr_scheduler.one_cycle import OneCycleLR
from cstorch.optim.lr_scheduler.lambda_lr import LambdaLR
from cstorch.optim.lr_scheduler.sequential import SequentialLR
from cstorch.optim.lr_scheduler.chained import ChainedLR, ChainedScheduler
from cstorch.optim.lr_scheduler.scale_per_param import ScalePerParamLR

__all__ = ["LRScheduler", "ConstantLR", "LinearLR", "PolynomialLR", "ExponentialLR",
           "InverseExponentialTimeDecayLR", "InverseSquareRootDecayLR", "CosineDecayLR",
           "CosineAnnealingLR", "CosineAnnealingWarmRestarts", "MultiStepLR", "StepLR",
           "PiecewiseConstantLR", "MultiplicativeLR", "CyclicLR", "OneCycleLR", "LambdaLR",
           "SequentialLR", "ChainedLR", "ChainedScheduler", "ScalePerParamLR",
           "Scheduler", "BaseChainedScheduler", "ConstantScheduler", "PolynomialScheduler",
           "LinearScheduler", "ExponentialScheduler", "InverseExponentialTimeDecayScheduler",
           "InverseSquareRootDecayScheduler", "CosineDecayScheduler", "CosineAnnealingScheduler",
           "CosineAnnealingWarmRestartsScheduler", "StepScheduler", "MultiStepScheduler",
           "MultiplicativeScheduler", "LambdaScheduler", "CyclicScheduler", "OneCycleScheduler",
           "SequentialScheduler", "PiecewiseConstantScheduler", "ScalePerParamScheduler"]
