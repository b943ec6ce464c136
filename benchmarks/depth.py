"""First step against depth: a GPT of width 256 (4 heads, vocabulary 1000, batch 4 x 128,
AdamW) at 2, 8, 24 and 48 layers, for each peer, each run in a fresh process so that its
first step is a true first step (imports done, nothing compiled or cached):

- eager: eager PyTorch; torch-compile: the model under `torch.compile`;
- jax: the model written by hand in JAX, one `jax.jit` step, its layers unrolled;
  jax-scan: the same with its layers in one `jax.lax.scan` over stacked weights;
- cstorch: a `@cstorch.trace` step on the CPU backend with identical layers looped
  (`cstorch.backends.csx.performance.scan_blocks = True`); cstorch-unrolled: the same
  with `scan_blocks = False` (the default); cstorch-trace-all: unrolled, and every layer
  traced (`trace_blocks_once = False`; by default a run of identical layers is traced
  once, `docs/scan-blocks.md`).

Each process times its first step (wall time, the loss read on the host), then the
median of `--steps` more. With `--repeats N` each cell runs in N processes, in N rounds
over all the cells, and the table gives the medians (this machine's timings move by 10-20%
between runs of one program). Run: python -m benchmarks.depth [--quick] [--layers 2,8]
[--peers a,b] [--repeats N] [--no-write]; prints the table and, unless --no-write, writes
it to docs/benchmarks.md (section "depth").
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks._report import write_section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = ("eager", "torch-compile", "jax", "jax-scan", "cstorch", "cstorch-unrolled",
         "cstorch-trace-all")
FULL = {"layers": (2, 8, 24, 48), "dim": 256, "seq": 128, "batch": 4, "steps": 5}
QUICK = {"layers": (2, 8), "dim": 64, "seq": 32, "batch": 4, "steps": 2}
VOCAB, HEADS = 1000, 4
MARK = "DEPTH-RESULT "


def _model(layers, dim, seq):
    import torch
    from examples.train_gpt import TinyGPT
    torch.manual_seed(0)
    return TinyGPT(vocab=VOCAB, dim=dim, heads=HEADS, layers=layers, block=seq)


def _batches(n, seq, batch):
    import torch
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (batch, seq + 1), generator=g) for _ in range(n)]


def _torch_peer(peer, model):
    import torch
    from examples.train_gpt import next_token_loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    net = torch.compile(model) if peer == "torch-compile" else model

    def step(tokens):
        loss = next_token_loss(net, tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return float(loss)
    return step


def _cstorch_peer(peer, model):
    import cerebras.pytorch as cstorch
    from examples.train_gpt import next_token_loss
    cstorch.backends.csx.performance.scan_blocks = peer == "cstorch"
    cstorch.backends.csx.performance.trace_blocks_once = peer != "cstorch-trace-all"
    cstorch.backend("CPU")
    compiled = cstorch.compile(model)
    optimizer = cstorch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-8, weight_decay=0.01)

    @cstorch.trace
    def step(tokens):
        loss = next_token_loss(compiled, tokens)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    return lambda tokens: float(step(tokens))


def _jax_peer(peer, model, layers):
    import jax
    import jax.numpy as jnp
    from benchmarks.peers import adamw
    from benchmarks.workloads import _jax
    params = {k: jnp.asarray(v) for k, v in _jax.params_of(model)[0].items()}
    names = sorted({k.split(".", 2)[2] for k in params if k.startswith("blocks.")})
    if peer == "jax-scan":
        stacked = {n: jnp.stack([params.pop(f"blocks.{i}.{n}") for i in range(layers)])
                   for n in names}
        params["blocks"] = stacked

    def block(p, x):
        qkv = _jax.linear(p, "attn.qkv", _jax.layer_norm(p, "ln1", x))
        q, k, v = jnp.split(qkv, 3, axis=-1)
        x = x + _jax.linear(p, "attn.proj", _jax.causal_attention(q, k, v, HEADS))
        h = _jax.linear(p, "mlp.0", _jax.layer_norm(p, "ln2", x))
        return x + _jax.linear(p, "mlp.2", jax.nn.gelu(h, approximate=False))

    def logits(p, idx):
        x = p["tok.weight"][idx] + p["pos"][:, :idx.shape[1]]
        if peer == "jax-scan":
            x, _ = jax.lax.scan(lambda x, b: (block(b, x), None), x, p["blocks"])
        else:
            for i in range(layers):
                x = block({n: p[f"blocks.{i}.{n}"] for n in names}, x)
        return _jax.layer_norm(p, "ln", x) @ p["tok.weight"].T

    init, update = adamw(1e-3, weight_decay=0.01)

    def train(state, tokens):
        p, opt = state
        loss, grads = jax.value_and_grad(
            lambda p: _jax.next_token_loss(lambda idx: logits(p, idx), tokens))(p)
        return update(p, grads, opt), loss

    jitted = jax.jit(train, donate_argnums=(0,))
    state = [(params, init(params))]

    def step(tokens):
        state[0], loss = jitted(state[0], jnp.asarray(tokens.numpy(), jnp.int32))
        return float(loss)
    return step


def measure(peer: str, layers: int, dim: int, seq: int, batch: int, steps: int) -> dict:
    """One peer at one depth, in this process: its first step and later steps."""
    model = _model(layers, dim, seq)
    data = _batches(steps + 1, seq, batch)
    start = time.perf_counter()
    if peer.startswith("cstorch"):
        step = _cstorch_peer(peer, model)
    elif peer.startswith("jax"):
        step = _jax_peer(peer, model, layers)
    else:
        step = _torch_peer(peer, model)
    loss = step(data[0])
    first = time.perf_counter() - start
    times = []
    for tokens in data[1:]:
        start = time.perf_counter()
        step(tokens)
        times.append(time.perf_counter() - start)
    result = {"first_step_s": first, "step_ms": 1e3 * statistics.median(times), "loss": loss}
    if peer.startswith("cstorch"):
        import bridge
        import wafer
        result.update(capture_s=bridge.capture_stats.tracing_seconds,
                      lowering_s=wafer.compile_stats.lowering_seconds,
                      xla_s=wafer.compile_stats.seconds)
    return result


def in_subprocess(peer, layers, size) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    args = [str(size[k]) for k in ("dim", "seq", "batch", "steps")]
    proc = subprocess.run([sys.executable, "-m", "benchmarks.depth", "--one", peer, str(layers),
                           *args], env=env, cwd=ROOT, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    return {"error": (proc.stderr.strip().splitlines() or ["no result"])[-1][:200]}


def table(results: dict, layers, peers) -> str:
    """Markdown: first step per peer and depth, its growth from the shallowest depth, and
    cstorch's first step and step time against each peer's."""
    lines = ["| peer | " + " | ".join(f"{n} layers" for n in layers) +
             f" | {layers[-1]} / {layers[0]} layers |",
             "|---|" + "---|" * (len(layers) + 1)]
    for peer in peers:
        cells = []
        for n in layers:
            r = results.get((peer, n), {})
            spread = r.get("first_step_runs", ())
            runs = f" [{', '.join(f'{x:.2f}' for x in spread)}]" if len(spread) > 1 else ""
            cells.append(f"{r['first_step_s']:.2f} s{runs} ({r['step_ms']:.0f} ms/step)"
                         if "first_step_s" in r else r.get("error", "-"))
        a, b = (results.get((peer, n), {}).get("first_step_s") for n in (layers[0], layers[-1]))
        growth = f"{b / a:.2f}x" if a and b else "-"
        lines.append(f"| {peer} | " + " | ".join(cells) + f" | {growth} |")
    lines += ["", "| cstorch against | " + " | ".join(f"{n} layers: first step, step"
                                                     for n in layers) + " |",
              "|---|" + "---|" * len(layers)]
    for peer in peers:
        if peer == "cstorch":
            continue
        cells = []
        for n in layers:
            ours, theirs = results.get(("cstorch", n), {}), results.get((peer, n), {})
            if "first_step_s" in ours and "first_step_s" in theirs:
                cells.append(f"{ours['first_step_s'] / theirs['first_step_s']:.2f}x, "
                             f"{ours['step_ms'] / theirs['step_ms']:.2f}x")
            else:
                cells.append("-")
        lines.append(f"| {peer} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def median_result(runs: list) -> dict:
    """One cell's result from its processes: the median of each number over the runs that
    succeeded, and every run's first step (`first_step_runs`); the last error if none did."""
    ok = [r for r in runs if "first_step_s" in r]
    if not ok:
        return runs[-1]
    out = {k: statistics.median(r[k] for r in ok) for k, v in ok[0].items()
           if isinstance(v, (int, float))}
    out["first_step_runs"] = [r["first_step_s"] for r in ok]
    return out


def run(quick: bool, layers=None, peers=PEERS, repeats: int = 1) -> dict:
    """Every peer at every depth, each in `repeats` fresh processes (rounds over all the
    cells, so that a slow spell of the machine touches every cell alike): {"workload":
    "depth", "text": the markdown table with its preamble, "results"}."""
    size = dict(QUICK if quick else FULL)
    layers = tuple(layers or size["layers"])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    runs = {}
    for _ in range(repeats):
        for n in layers:
            for peer in peers:
                r = in_subprocess(peer, n, size)
                runs.setdefault((peer, n), []).append(r)
                print(f"depth: {peer} at {n} layers: {r}", flush=True)
    results = {cell: median_result(rs) for cell, rs in runs.items()}
    each = (f"the median of {repeats} fresh processes per cell, their first steps in "
            f"brackets" if repeats > 1 else "one fresh process per cell")
    text = (f"GPT width {size['dim']}, {HEADS} heads, vocabulary {VOCAB}, batch "
            f"{size['batch']} x {size['seq']}, AdamW; first step (imports excluded) and the "
            f"median of {size['steps']} later steps, {each}. Load average at the start: "
            f"{load}.\n\n" + table(results, layers, peers))
    return {"workload": "depth", "text": text,
            "results": {f"{p} {n}": r for (p, n), r in results.items()}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--layers", help="comma-separated depths")
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--repeats", type=int, default=1,
                        help="fresh processes per peer and depth (the table gives medians)")
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        peer, layers, dim, seq, batch, steps = args.one
        print(MARK + json.dumps(measure(peer, *map(int, (layers, dim, seq, batch, steps)))))
        return
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(PEERS)
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}; known: {', '.join(PEERS)}")
    layers = [int(n) for n in args.layers.split(",")] if args.layers else None
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    text = run(args.quick, layers, peers, args.repeats)["text"]
    print(text)
    if not args.no_write:
        write_section("depth", text)


if __name__ == "__main__":
    main()
