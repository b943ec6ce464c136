"""Training-step throughput: a traced cstorch step against eager PyTorch, same process.

    python benchmarks/step_throughput.py [--steps 30] [--mlp-steps 300] [--repeats 5]

Two tables. Per-step overhead on a tiny MLP (benchmarks/mlp_step.py): eager PyTorch, a
hand-written `jax.jit` step and the traced step, as milliseconds per step and speed
relative to the hand-written JAX step. Throughput on small GPTs (SGD with momentum,
gradient clipping) on the same batches: steps per second and the ratio cstorch / eager.
"""
import argparse
import copy
import importlib
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cerebras.pytorch as cstorch  # noqa: E402
from benchmarks._report import write_section  # noqa: E402
from benchmarks import mlp_step  # noqa: E402
from examples.train_gpt import TinyGPT, next_token_loss, update  # noqa: E402

# Several runs in one process, each on a backend of its own: each new backend replaces
# the last, as in the test suite (a user's second backend is refused).
importlib.import_module("cstorch.backend")._replacing_allowed = True


def timed(run, batches, warmup=3):
    for tokens in batches[:warmup]:
        run(tokens)
    start = time.perf_counter()
    for tokens in batches[warmup:]:
        last = run(tokens)
    float(last)  # wait for the last step
    return (len(batches) - warmup) / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--mlp-steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    mlp_table = mlp_step.table(args.mlp_steps, args.repeats)
    rows = []
    for dim, layers, batch in ((64, 2, 16), (128, 4, 16)):
        torch.manual_seed(0)
        base = TinyGPT(vocab=256, dim=dim, heads=4, layers=layers, block=64)
        g = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, 256, (batch, 65), generator=g) for _ in range(args.steps + 3)]

        eager_model = copy.deepcopy(base)
        eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.1, momentum=0.9)

        def eager_step(tokens):
            loss = next_token_loss(eager_model, tokens)  # noqa: B023
            update(loss, eager_model.parameters(), eager_opt)  # noqa: B023
            return loss

        cstorch.backend("CPU", artifact_dir=os.path.join("/tmp", "cstorch_bench_logs"))
        model = copy.deepcopy(base)
        compiled = cstorch.compile(model)
        opt = cstorch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        @cstorch.trace
        def traced_step(tokens):
            loss = next_token_loss(compiled, tokens)  # noqa: B023 (timed within this iteration)
            update(loss, model.parameters(), opt)  # noqa: B023
            return loss

        eager = timed(eager_step, batches)
        ours = timed(traced_step, batches)
        params = sum(p.numel() for p in base.parameters())
        rows.append((f"GPT dim {dim}, {layers} layers, batch {batch}x64 ({params/1e6:.2f}M params)",
                     eager, ours, ours / eager))
    table = ["| model | eager PyTorch (steps/s) | cstorch traced (steps/s) | ratio |",
             "| --- | --- | --- | --- |"]
    table += [f"| {m} | {e:.1f} | {o:.1f} | {r:.2f}x |" for m, e, o, r in rows]
    import jax
    text = ("## Training-step throughput\n\n"
            f"`python benchmarks/step_throughput.py --steps {args.steps} --mlp-steps "
            f"{args.mlp_steps} --repeats {args.repeats}` on {platform.machine()} with "
            f"{os.cpu_count()} cores, torch {torch.__version__}, jax {jax.__version__}. Run it on "
            f"an otherwise idle machine: eager PyTorch's OpenMP threads slow down sharply when "
            f"other processes load the cores, which inflates the ratio.\n\n"
            f"Per-step overhead: each peer runs {args.mlp_steps} steps per pass, one warm-up pass "
            f"then {args.repeats} timed passes (capture and compilation excluded); median and "
            f"spread over the passes.\n\n" + mlp_table + "\n\n"
            "Throughput after 3 warm-up steps:\n\n" + "\n".join(table))
    print(text)
    write_section("step_throughput", text)


if __name__ == "__main__":
    main()
