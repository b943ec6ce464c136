"""Inspect checkpoints and convert them between Cerebras HDF5, Orbax and `torch.save`.

    python -m cstorch.storage.cli inspect PATH
    python -m cstorch.storage.cli convert SRC DST --to {hdf5,orbax,torch} [--force]

The source format is detected from the file itself: an Orbax checkpoint is a directory,
an HDF5 checkpoint starts with the HDF5 signature, anything else is tried with
`torch.load` (weights only: no code from the file runs). Python values (ints, strings,
None) survive HDF5 <-> torch; Orbax keeps tensors as arrays and plain Python values in its
JSON item, and drops other objects with a warning (they come back as None).
"""
import argparse
import os
import secrets
import sys
import warnings

import h5py
import torch
import torch.utils._pytree as pytree

import cstorch.storage as storage
from cstorch.storage.orbax import is_orbax_checkpoint
from cstorch.storage.pytree import ensure_namedtuples_registered, leaf_keys

FORMATS = ("hdf5", "orbax", "torch")


def detect_format(path) -> str:
    """"orbax", "hdf5" or "torch" for an existing checkpoint at `path`."""

    path = os.fspath(path)
    if not os.path.exists(path):
        raise RuntimeError(f"checkpoint {path} does not exist")
    if os.path.isdir(path):
        if is_orbax_checkpoint(path):
            return "orbax"
        raise RuntimeError(f"{path} is a directory but not an Orbax checkpoint")
    try:
        if h5py.is_hdf5(path):
            return "hdf5"
    except Exception:
        pass
    return "torch"


def read(path, lazy: bool = False):
    """The checkpoint's content, tensors on the host (HDF5 tensors lazily with `lazy`)."""
    return storage.load(path, map_location=None if lazy else "cpu")


def write(obj, path, fmt: str, force: bool = False) -> list:
    """Write `obj` to `path` in format `fmt`; returns the keys that could not be stored."""

    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    path = os.fspath(path)
    if os.path.exists(path) and not force:
        raise FileExistsError(f"{path} already exists; pass --force to replace it")
    if fmt == "orbax":
        return storage.save_tree_orbax(obj, path, overwrite=force)
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path}: it is a directory")
    if fmt == "hdf5":
        storage.save(obj, path)
        return []
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path}: directory {directory} does not exist")
    # As for HDF5: a temporary name, renamed when complete, so a failure keeps the old file.
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return []


def convert(src, dst, to: str, force: bool = False) -> list:
    """Convert checkpoint `src` (any format) to `dst` in format `to`; returns dropped keys."""
    if to not in FORMATS:
        raise ValueError(f"unknown format {to!r}; expected one of {', '.join(FORMATS)}")
    if os.path.abspath(os.fspath(src)) == os.path.abspath(os.fspath(dst)):
        raise ValueError("source and destination are the same path; choose another destination")
    detect_format(src)  # a clear error for a missing or unreadable source
    return write(read(src), dst, to, force=force)


# inspect --------------------------------------------------------------------------------

def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def entries(obj) -> list:
    """(key, kind, shape, dtype, bytes) of every leaf of a loaded checkpoint."""
    ensure_namedtuples_registered(obj)
    leaves, spec = pytree.tree_flatten(obj)
    rows = []
    for key, leaf in zip(leaf_keys(spec), leaves):
        if isinstance(leaf, torch.Tensor):
            dtype = str(leaf.dtype).replace("torch.", "")
            nbytes = leaf.numel() * leaf.element_size()
            rows.append((key, "tensor", "x".join(map(str, leaf.shape)) or "()", dtype, nbytes))
        else:
            text = repr(leaf)
            if len(text) > 40:
                text = text[:37] + "..."
            rows.append((key, type(leaf).__name__, "", text, 0))
    return rows


def format_table(path, fmt, rows) -> str:
    header = ("key", "type", "shape", "dtype/value", "size")
    body = [(k, t, s, d, _human(b) if t == "tensor" else "") for k, t, s, d, b in rows]
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(5)]
    line = "  ".join("-" * w for w in widths)
    out = [f"{path} ({fmt})", "  ".join(h.ljust(w) for h, w in zip(header, widths)), line]
    for r in body:
        out.append("  ".join(str(c).rjust(w) if i == 4 else str(c).ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    out.append(line)
    tensors = [r for r in rows if r[1] == "tensor"]
    total = sum(r[4] for r in tensors)
    out.append(f"{len(rows)} entries, {len(tensors)} tensors, total {_human(total)} ({total} bytes)")
    return "\n".join(out)


def inspect(path) -> str:
    """A table of the checkpoint's keys, shapes, dtypes and sizes, with the total size."""
    fmt = detect_format(path)
    obj = read(path, lazy=(fmt == "hdf5"))
    return format_table(os.fspath(path), fmt, entries(obj))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cstorch.storage.cli",
                                     description="Inspect and convert cstorch checkpoints.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_inspect = sub.add_parser("inspect", help="list keys, shapes, dtypes and sizes")
    p_inspect.add_argument("path")
    p_convert = sub.add_parser("convert", help="convert SRC (any format) to DST")
    p_convert.add_argument("src")
    p_convert.add_argument("dst")
    p_convert.add_argument("--to", required=True, choices=FORMATS)
    p_convert.add_argument("--force", action="store_true", help="replace DST if it exists")
    args = parser.parse_args(argv)
    try:
        if args.command == "inspect":
            print(inspect(args.path))
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dropped = convert(args.src, args.dst, args.to, force=args.force)
            print(f"wrote {args.dst} ({args.to}) from {args.src} ({detect_format(args.src)})")
            if dropped:
                print(f"not stored (not tensors or plain values; they load as None): "
                      f"{', '.join(dropped)}", file=sys.stderr)
    except (RuntimeError, ValueError, TypeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
