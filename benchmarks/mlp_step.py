"""Per-step overhead on a tiny model: where framework cost, not compute, decides speed.

A 3-layer width-64 MLP (batch 32, SGD momentum 0.9, cross-entropy) trained in one process
on the same batches by the peers of benchmarks/peers.py: eager PyTorch; the same model
written by hand as one `jax.jit` step (donated state), with the loss read on the host every
step and every 10th step; and the cstorch traced step, read the same two ways. Imported by
step_throughput.py; `python -m benchmarks` runs the same model as its mlp-tiny workload.
"""
import copy
import statistics
import time

import jax
import jax.numpy as jnp
import torch


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
    # The peers of `python -m benchmarks` on its mlp-tiny workload (this model).
    from benchmarks import peers as makers
    from benchmarks.workloads import mlp_tiny
    batches = mlp_tiny.batches(steps)
    base = make_model()
    # One backend per process, as in the real API: built before the others.
    traced = makers.cstorch_peer(mlp_tiny, copy.deepcopy(base))
    by_hand = makers.jax_peer(mlp_tiny, base)
    peers = [("eager PyTorch, loss read every step", makers.eager(mlp_tiny, copy.deepcopy(base)),
              1),
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
