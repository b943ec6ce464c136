"""Per-step overhead on a tiny model: where framework cost, not compute, decides speed.

A 3-layer width-64 MLP (batch 32, SGD momentum 0.9, cross-entropy) trained four ways in one
process on the same batches: eager PyTorch; the same model written by hand as one
`jax.jit` step (donated state, loss read on the host every step); and the cstorch traced
step with the loss read every step and every 10th step. Imported by step_throughput.py.
"""
import copy
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F

import cerebras.pytorch as cstorch

LR, MOMENTUM, WIDTH, BATCH, CLASSES = 0.05, 0.9, 64, 32, 10


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                               torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                               torch.nn.Linear(WIDTH, CLASSES))


def jax_loss(ps, x, y):
    """The MLP's cross-entropy in JAX; `ps` are its parameters in `parameters()` order."""
    h = x
    for i in range(0, len(ps) - 2, 2):
        h = jax.nn.relu(h @ ps[i].T + ps[i + 1])
    logits = h @ ps[-2].T + ps[-1]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def jax_peer(model):
    """The same model and update written by hand in JAX."""
    params = [jnp.asarray(p.detach().numpy()) for p in model.parameters()]
    bufs = [jnp.zeros_like(p) for p in params]

    @jax.jit
    def step(state, x, y):
        ps, bs = state
        loss, grads = jax.value_and_grad(jax_loss)(ps, x, y)
        bs = [MOMENTUM * b + g for b, g in zip(bs, grads)]
        ps = [p - LR * b for p, b in zip(ps, bs)]
        return (ps, bs), loss
    step = jax.jit(step.__wrapped__, donate_argnums=(0,))
    state = [(params, bufs)]

    def run(x, y, read):
        state[0], loss = step(state[0], x.numpy(), y.numpy().astype(np.int32))
        if read:
            float(loss)
        return loss
    return run


def eager_peer(model):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    def run(x, y, read):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if read:
            loss.item()
        return loss
    return run


def cstorch_peer(model):
    cstorch.backend("CPU", artifact_dir="/tmp/cstorch_bench_logs")
    compiled = cstorch.compile(model)
    opt = cstorch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    @cstorch.trace
    def step(x, y):
        loss = F.cross_entropy(compiled(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    def run(x, y, read):
        loss = step(x, y)
        if read:
            loss.item()
        return loss
    return run


def one_pass(run, batches, every):
    """Milliseconds per step over one pass over `batches`, the loss read on the host every
    `every` steps and after the last one. A batch is a tuple of the step's arguments."""
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        last = run(*batch, i % every == 0)
    last.item() if isinstance(last, torch.Tensor) else float(last)
    return (time.perf_counter() - start) / len(batches) * 1e3


def rows(steps=300, repeats=5):
    """(peer, median ms/step, min, max, speed relative to the hand-written JAX step). The
    peers take turns pass by pass, so a slow spell of the machine hits them all alike."""
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(BATCH, WIDTH, generator=g),
                torch.randint(0, CLASSES, (BATCH,), generator=g)) for _ in range(steps)]
    base = make_model()
    traced = cstorch_peer(copy.deepcopy(base))  # one backend per process, as in the real API
    by_hand = jax_peer(base)
    peers = [("eager PyTorch, loss read every step", eager_peer(copy.deepcopy(base)), 1),
             ("hand-written jax.jit step, loss read every step", by_hand, 1),
             ("hand-written jax.jit step, loss read every 10th step", by_hand, 10),
             ("cstorch traced step, loss read every step", traced, 1),
             ("cstorch traced step, loss read every 10th step", traced, 10)]
    for _, run, every in peers:  # warm-up: capture and compilation happen here
        one_pass(run, batches, every)
    times = [[] for _ in peers]
    for _ in range(repeats):
        for t, (_, run, every) in zip(times, peers):
            t.append(one_pass(run, batches, every))
    jax_ms = statistics.median(times[1])
    return [(name, statistics.median(t), min(t), max(t), jax_ms / statistics.median(t))
            for (name, _, _), t in zip(peers, times)]


def table(steps=300, repeats=5):
    lines = ["| MLP 3x64, batch 32, SGD momentum | ms/step (median) | spread (min-max) "
             "| speed vs hand-written jax.jit |",
             "| --- | ---: | ---: | ---: |"]
    for name, med, lo, hi, ratio in rows(steps, repeats):
        lines.append(f"| {name} | {med:.3f} | {lo:.3f}-{hi:.3f} | {ratio:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
