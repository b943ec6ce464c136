"""Checkpoint throughput: cstorch.save/load of 1 GiB of float32 state, beside torch.save/
torch.load and the disk's raw sequential write/read speed, all measured in one run.

    .venv/bin/python benchmarks/checkpoint_io.py [--gib 1] [--dir DIR] [--no-doc]

Writes include fsync (cstorch.save syncs before its atomic rename; the raw and torch.save
rows are synced too, so all rows count bytes on disk). Reads drop the file from the page
cache first where the OS allows (posix_fadvise DONTNEED), so they measure the disk too.
The table is written to docs/benchmarks.md under "Checkpoint I/O".
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cstorch  # noqa: E402
from benchmarks._report import write_section  # noqa: E402

SECTION = "## Checkpoint I/O"


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _round(d, state, total):
    """One pass over every operation; returns {name: seconds}."""
    times = {}
    raw = os.path.join(d, "raw.bin")
    block = os.urandom(16 << 20)

    def raw_write():
        with open(raw, "wb") as f:
            for _ in range(total // len(block)):
                f.write(block)
        _fsync(raw)

    def raw_read():
        with open(raw, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass

    times["raw sequential write"], _ = _timed(raw_write)
    _drop_cache(raw)
    times["raw sequential read"], _ = _timed(raw_read)
    os.remove(raw)

    tp = os.path.join(d, "state.pt")

    def torch_save():
        torch.save(state, tp)
        _fsync(tp)

    times["torch.save"], _ = _timed(torch_save)
    _drop_cache(tp)
    times["torch.load"], _ = _timed(lambda: torch.load(tp))
    os.remove(tp)

    cp = os.path.join(d, "state.mdl")
    times["cstorch.save"], _ = _timed(lambda: cstorch.save(state, cp))
    _drop_cache(cp)
    times['cstorch.load(map_location="cpu")'], out = _timed(
        lambda: cstorch.load(cp, map_location="cpu"))
    assert all(torch.equal(out[k], v) for k, v in state.items())
    del out
    _drop_cache(cp)

    def lazy_touch():
        loaded = cstorch.load(cp)
        return sum(float(v.sum()) for v in loaded.values())

    times["cstorch.load(lazy) + read every tensor"], _ = _timed(lazy_touch)
    cstorch.backends.csx.performance.compress_weights = True
    try:
        times["cstorch.save, LZ4"], _ = _timed(lambda: cstorch.save(state, cp))
        _drop_cache(cp)
        times['cstorch.load(map_location="cpu"), LZ4'], _ = _timed(
            lambda: cstorch.load(cp, map_location="cpu"))
    finally:
        cstorch.backends.csx.performance.compress_weights = False
    os.remove(cp)
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3, help="passes; the median of each is shown")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()

    nbytes = int(args.gib * (1 << 30))
    per = 64 << 20  # 64 MiB tensors, like large layers
    state = {f"layer{i}.weight": torch.randn(per // 4) for i in range(max(1, nbytes // per))}
    total = sum(t.numel() * 4 for t in state.values())
    gib = total / (1 << 30)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        rounds = [_round(d, state, total) for _ in range(args.rounds)]
    median = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}

    lines = [f"| operation ({gib:.2f} GiB float32, {len(state)} tensors) | seconds (median of "
             f"{args.rounds}) | GiB/s | vs torch |", "| --- | ---: | ---: | ---: |"]
    for name, t in median.items():
        peer = ("torch.save" if "save" in name else "torch.load" if "load" in name else None)
        ratio = f"{median[peer] / t:.2f}x" if peer and not name.startswith("torch") else ""
        lines.append(f"| {name} | {t:.2f} | {gib / t:.2f} | {ratio} |")
    table = "\n".join(lines)
    print(table)

    if not args.no_doc:
        body = (f"{SECTION}\n\n`python benchmarks/checkpoint_io.py --rounds {args.rounds}` on "
                f"{os.cpu_count()} CPUs; writes are fsynced and reads start from a cold page cache "
                f"where the OS allows. Random float32 data barely compresses, so LZ4 rows show the "
                f"filter's cost. The disk of this machine is shared and noisy: compare rows of one "
                f"run only.\n\n{table}\n")
        write_section("checkpoint_io", body)


if __name__ == "__main__":
    main()
