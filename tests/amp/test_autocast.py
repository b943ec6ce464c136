"""cstorch.amp.autocast and the CPU backend's mixed_precision against torch.autocast."""
import copy

import numpy as np
import pytest
import torch

import cerebras.pytorch as cstorch


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 4))


def _train(model, run_forward, steps=3):
    optimizer = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x, y):
        out = run_forward(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss, out

    g = torch.Generator().manual_seed(1)
    results = [step(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g))
               for _ in range(steps)]
    return [(float(loss), out.dtype) for loss, out in results]


def _eager(model, steps=3):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    results = []
    for _ in range(steps):
        x, y = torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        results.append((loss.item(), out.dtype))
    return results


@pytest.mark.parametrize("how", ["context", "backend"])
def test_bfloat16_autocast_in_a_traced_step_follows_torch(how):
    model = _model()
    reference = copy.deepcopy(model)
    want = _eager(reference)
    saved = cstorch.amp.get_half_dtype_str(), cstorch.amp.mixed_precision()
    cstorch.amp.set_half_dtype("bfloat16")
    try:
        if how == "backend":
            compiled = cstorch.compile(model, cstorch.backend("CPU", mixed_precision=True))
            got = _train(model, compiled)
        else:
            compiled = cstorch.compile(model, cstorch.backend("CPU"))

            def forward(x):
                with cstorch.amp.autocast():
                    return compiled(x)
            got = _train(model, forward)
    finally:
        cstorch.amp.set_half_dtype(saved[0])
        cstorch.amp.enable_mixed_precision(saved[1])   # set_half_dtype switched it on
    assert [d for _, d in got] == [d for _, d in want] == [torch.bfloat16] * 3
    # bfloat16 matmuls: XLA and torch's CPU kernels accumulate differently
    np.testing.assert_allclose([v for v, _ in got], [v for v, _ in want], rtol=1e-2)


def test_without_mixed_precision_the_step_stays_float32():
    model = _model()
    compiled = cstorch.compile(model, cstorch.backend("CPU"))
    assert [d for _, d in _train(model, compiled, steps=1)] == [torch.float32]
