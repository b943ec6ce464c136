"""Peak host memory of training, and a tiny BERT classifier's first step, per peer.

Peak memory: 3 AdamW steps of a GPT (examples/train_gpt.py's TinyGPT) of width 1024 and
12 layers (153M parameters; width 256 and 2 layers with --quick), batch 4x128, for eager
PyTorch, torch.compile and cstorch (CPU backend), each in a fresh process that reports its
peak resident set size (`resource.getrusage(RUSAGE_SELF).ru_maxrss`: start-up, model,
optimizer state, compilation and the steps, everything the process ever held at once).
16 bytes a parameter (weights, gradients, two moments) is the floor any peer needs.

First step: a tiny `transformers` BertForSequenceClassification (built from a config,
nothing downloaded) trained one AdamW step, from the call to the loss on the host, each
peer in a fresh process (imports excluded; capture and compilation included).

Run one at a time (the 153M runs take several GB each):
python -m benchmarks.peak_memory [--quick]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = ("eager", "torch-compile", "cstorch")
GPT = {"full": {"vocab": 2000, "dim": 1024, "heads": 16, "layers": 12, "block": 128},
       "quick": {"vocab": 2000, "dim": 256, "heads": 4, "layers": 2, "block": 128}}
BATCH, STEPS = 4, 3

_COMMON = r"""
import json, resource, sys, time
import torch
import torch.nn.functional as F
peer = sys.argv[1]
torch.manual_seed(0)


def train(model, loss_of, batches, lr=1e-4):
    if peer == "cstorch":
        import cerebras.pytorch as cstorch
        backend = cstorch.backend("CPU")
        compiled = cstorch.compile(model, backend)
        optimizer = cstorch.optim.AdamW(model.parameters(), lr=lr)

        @cstorch.trace
        def step(*batch):
            loss = loss_of(compiled, *batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss
    else:
        run = torch.compile(model) if peer == "torch-compile" else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

        def step(*batch):
            loss = loss_of(run, *batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss
    times, losses = [], []
    for batch in batches:
        start = time.perf_counter()
        losses.append(float(step(*batch)))
        times.append(time.perf_counter() - start)
    return times, losses
"""

GPT_SCRIPT = _COMMON + r"""
from examples.train_gpt import TinyGPT, next_token_loss
sizes = json.loads(sys.argv[2])
model = TinyGPT(**sizes)
params = sum(p.numel() for p in model.parameters())
gen = torch.Generator().manual_seed(1)
batches = [(torch.randint(0, sizes["vocab"], (BATCH, sizes["block"] + 1), generator=gen),)
           for _ in range(STEPS)]
times, losses = train(model, next_token_loss, batches)
print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "params": params, "losses": losses, "step_s": times}))
""".replace("BATCH", str(BATCH)).replace("STEPS", str(STEPS))

BERT_SCRIPT = _COMMON + r"""
from transformers import BertConfig, BertForSequenceClassification
config = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=64, num_labels=3,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
model = BertForSequenceClassification(config)
gen = torch.Generator().manual_seed(1)
ids = torch.randint(0, 512, (4, 32), generator=gen)
labels = torch.randint(0, 3, (4,), generator=gen)


def loss_of(m, ids, labels):
    return F.cross_entropy(m(input_ids=ids).logits, labels)


times, losses = train(model, loss_of, [(ids, labels)])
print(json.dumps({"first_step_s": times[0], "loss": losses[0],
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def _run(script, *args):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode:
        return {"error": f"exit status {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_memory(mode="full", peers=PEERS):
    """{peer: {"peak_rss", "params", "losses", "step_s"}}, one fresh process each, one at a
    time."""
    return {peer: _run(GPT_SCRIPT, peer, json.dumps(GPT[mode])) for peer in peers}


def bert_first_step(peers=PEERS):
    """{peer: {"first_step_s", "loss", "peak_rss"}}, one fresh process each."""
    return {peer: _run(BERT_SCRIPT, peer) for peer in peers}


def memory_table(memory, mode="full") -> str:
    g = GPT[mode]
    lines = [f"GPT of width {g['dim']} and {g['layers']} layers, batch {BATCH}x{g['block']}, "
             f"{STEPS} AdamW steps, each peer in a fresh process (ru_maxrss):", "",
             "| peer | parameters | peak RSS (GB) | vs eager | bytes per parameter |",
             "| --- | ---: | ---: | ---: | ---: |"]
    eager = memory.get("eager", {}).get("peak_rss")
    for peer, r in memory.items():
        if "error" in r:
            lines.append(f"| {peer} | failed: {r['error']} | | | |")
            continue
        ratio = f"{r['peak_rss'] / eager:.2f}x" if eager else ""
        lines.append(f"| {peer} | {r['params']:,} | {r['peak_rss'] / 1e9:.2f} | {ratio} | "
                     f"{r['peak_rss'] / r['params']:.1f} |")
    return "\n".join(lines)


def bert_table(bert) -> str:
    lines = ["Tiny BERT classifier (transformers, 2 layers of width 64, batch 4x32), first "
             "AdamW step in a fresh process (capture and compilation included):", "",
             "| peer | first step (s) | loss |", "| --- | ---: | ---: |"]
    for peer, r in bert.items():
        if "error" in r:
            lines.append(f"| {peer} | failed: {r['error']} | |")
        else:
            lines.append(f"| {peer} | {r['first_step_s']:.2f} | {r['loss']:.4f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peak_memory")
    parser.add_argument("--quick", action="store_true", help="a GPT of width 256, 2 layers")
    args = parser.parse_args(argv)
    mode = "quick" if args.quick else "full"
    print(memory_table(peak_memory(mode), mode) + "\n\n" + bert_table(bert_first_step()))


if __name__ == "__main__":
    main()
