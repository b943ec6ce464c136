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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()

    nbytes = int(args.gib * (1 << 30))
    per = 64 << 20  # 64 MiB tensors, like large layers
    state = {f"layer{i}.weight": torch.randn(per // 4) for i in range(max(1, nbytes // per))}
    total = sum(t.numel() * 4 for t in state.values())
    gib = total / (1 << 30)
    rows = []

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
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

        t, _ = _timed(raw_write)
        rows.append(("raw sequential write", t))
        _drop_cache(raw)
        t, _ = _timed(raw_read)
        rows.append(("raw sequential read", t))
        os.remove(raw)

        tp = os.path.join(d, "state.pt")

        def torch_save():
            torch.save(state, tp)
            _fsync(tp)

        t, _ = _timed(torch_save)
        rows.append(("torch.save", t))
        _drop_cache(tp)
        t, _ = _timed(lambda: torch.load(tp))
        rows.append(("torch.load", t))
        os.remove(tp)

        cp = os.path.join(d, "state.mdl")
        t, _ = _timed(lambda: cstorch.save(state, cp))
        rows.append(("cstorch.save", t))
        _drop_cache(cp)
        t, out = _timed(lambda: cstorch.load(cp, map_location="cpu"))
        rows.append(('cstorch.load(map_location="cpu")', t))
        assert all(torch.equal(out[k], v) for k, v in state.items())
        del out
        _drop_cache(cp)

        def lazy_touch():
            loaded = cstorch.load(cp)
            return sum(float(v.sum()) for v in loaded.values())

        t, _ = _timed(lazy_touch)
        rows.append(("cstorch.load(lazy) + read every tensor", t))

        cstorch.backends.csx.performance.compress_weights = True
        try:
            t, _ = _timed(lambda: cstorch.save(state, cp))
            rows.append(("cstorch.save, LZ4", t))
            _drop_cache(cp)
            t, _ = _timed(lambda: cstorch.load(cp, map_location="cpu"))
            rows.append(('cstorch.load(map_location="cpu"), LZ4', t))
        finally:
            cstorch.backends.csx.performance.compress_weights = False

    lines = [f"| operation ({gib:.2f} GiB float32, {len(state)} tensors) | seconds | GiB/s |",
             "| --- | ---: | ---: |"]
    lines += [f"| {name} | {t:.2f} | {gib / t:.2f} |" for name, t in rows]
    table = "\n".join(lines)
    print(table)

    if not args.no_doc:
        body = (f"{SECTION}\n\nMeasured by `benchmarks/checkpoint_io.py` on {os.cpu_count()} CPUs; "
                f"writes are fsynced and reads start from a cold page cache where the OS allows. "
                f"Random float32 data barely compresses, so LZ4 rows show the filter's cost.\n\n{table}\n")
        write_section("checkpoint_io", body)


if __name__ == "__main__":
    main()
