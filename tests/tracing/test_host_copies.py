"""Once a model's parameters and its optimizer's state live on the device, the process
keeps no host copy of them: after `cstorch.compile` and a first step, no NumPy array or
ordinary torch tensor of a parameter's size is left."""
import gc

import numpy as np
import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor

import cerebras.pytorch as cstorch
from bridge.device_tensor import DeviceTensor
from tests.models import classifier_step


def _host_arrays_of(numel: int) -> list:
    gc.collect()
    found = []
    for obj in gc.get_objects():
        kind = type(obj)   # not isinstance: it reads deprecated objects' __class__
        if kind is np.ndarray and obj.size == numel:
            found.append(("ndarray", obj.shape))
        elif issubclass(kind, torch.Tensor) and not issubclass(kind, (DeviceTensor, FakeTensor)) \
                and not obj.is_meta and obj.numel() == numel:
            found.append((type(obj).__name__, tuple(obj.shape)))
    return found


def test_no_host_copy_of_parameters_or_optimizer_state_after_the_first_step():
    width = 384   # a parameter size nothing else in the test process has
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width + 1), nn.Tanh(), nn.Linear(width + 1, 3))
    expected = model[0].weight.detach().clone()
    backend = cstorch.backend("CPU")
    compiled = cstorch.compile(model, backend)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=0.0)

    step = classifier_step(compiled, optimizer)

    float(step(torch.randn(4, width), torch.randint(0, 3, (4,))))
    numel = width * (width + 1)
    kept = expected
    del expected
    assert _host_arrays_of(numel) == [("Tensor", (width + 1, width))]   # only `kept`, ours
    del kept
    assert _host_arrays_of(numel) == []
    # the values are on the device, unchanged by a zero learning rate
    torch.manual_seed(0)
    again = nn.Linear(width, width + 1)
    assert torch.equal(model[0].weight.detach().to("cpu").clone(), again.weight.detach())
