"""python -m tools.conformance [--dtypes float32] [--modes forward,backward] [--ops a,b]
[--max-samples N] [--timeout S] [--jobs J] [--run-excluded] [--report docs/op-coverage.md]"""
import argparse
import multiprocessing
import shlex
import sys
import time

import torch

from tools.conformance.entries import DTYPES, MODES, op_entries, run_numbered_task, run_task
from tools.conformance.report import summary, write_report


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m tools.conformance",
        description="Bridge lowerings vs eager PyTorch over PyTorch's OpInfo suite.")
    parser.add_argument("--dtypes", default="float32", help="comma list: " + ",".join(DTYPES))
    parser.add_argument("--modes", default=",".join(MODES), help="comma list: " + ",".join(MODES))
    parser.add_argument("--ops", default="", help="comma list of entry or op names (default: all)")
    parser.add_argument("--max-samples", type=int, default=None,
                        help="run at most N samples per entry, spread evenly (default: all)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per sample")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--run-excluded", action="store_true",
                        help="also run the entries PyTorch's own suite excludes, and report "
                             "the pass rate with them counted")
    parser.add_argument("--report", default="docs/op-coverage.md", help="'' for none")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if unknown := set(dtypes) - set(DTYPES):
        parser.error(f"unknown dtypes {sorted(unknown)}")
    from torch.testing._internal.common_methods_invocations import op_db
    wanted = {id(op) for op in op_entries([n for n in args.ops.split(",") if n])}
    # forward and backward of an entry side by side: a run stopped early still has both
    tasks = [(i, d, args.max_samples, args.timeout, m, args.run_excluded)
             for i, op in enumerate(op_db) if id(op) in wanted for d in dtypes for m in modes]

    start, results = time.time(), [None] * len(tasks)

    def show(k, r):
        results[k] = r
        ran = f" (run anyway: {r.excluded_outcome}) {r.excluded_detail}" \
            if r.excluded_outcome else ""
        print(f"{r.mode:8s} {r.status:11s} {r.dtype:9s} {r.name:45s} {r.samples} "
              f"of {r.total_samples} {r.detail}{ran}", flush=True)

    try:  # Ctrl-C (SIGINT) stops the run and reports what is done
        if args.jobs > 1:
            # spawn: a forked child would inherit JAX's and torch's threads mid-flight.
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(args.jobs, maxtasksperchild=50) as pool:
                for k, r in pool.imap_unordered(run_numbered_task, list(enumerate(tasks))):
                    show(k, r)
        else:
            torch.set_num_threads(1)
            for k, task in enumerate(tasks):
                show(k, run_task(task))
    except KeyboardInterrupt:
        print(f"interrupted: {sum(r is not None for r in results)} of {len(tasks)} done")
    done = [r for r in results if r is not None]
    for (mode, dtype), c in summary(done).items():
        print(f"TOTAL {mode} {dtype}: {c}")
    if args.report:
        command = "python -m tools.conformance " + shlex.join(argv)
        write_report(done, args.report, command.strip(), time.time() - start, args.max_samples,
                     not_run=len(tasks) - len(done))
    return done


if __name__ == "__main__":
    main()
