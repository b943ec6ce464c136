"""One OpInfo entry in one dtype and mode, over its sample inputs: an `EntryResult`."""
import contextlib
import signal
from dataclasses import dataclass, field

import torch

from tools.conformance.exclusions import GRADIENT_TESTS, TRACING_TESTS, excluded_reason
from tools.conformance.samples import entry_name, run_backward, run_forward

MODES = ("forward", "backward")


@dataclass
class EntryResult:
    name: str
    dtype: str
    mode: str
    status: str  # pass | fail | refused | excluded | unsupported | no-samples
    samples: dict = field(default_factory=dict)  # outcome -> count, over the samples run
    total_samples: int = 0  # samples the entry has, run or not (above a cap)
    detail: str = ""
    # An excluded entry run anyway (--run-excluded): its outcome and what it said.
    excluded_outcome: str = ""
    excluded_detail: str = ""


class _SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds):
    if not seconds:
        yield
        return

    def on_alarm(signum, frame):
        raise _SampleTimeout(f"sample took longer than {seconds:g}s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def unsupported_reason(op, dtype, mode) -> str | None:
    if not op.supports_dtype(dtype, "cpu"):
        return f"no {dtype} on CPU"
    if mode == "backward":
        if not op.supports_autograd:
            return "no autograd"
        if dtype not in op.supported_backward_dtypes("cpu"):
            return f"no {dtype} backward on CPU"
    return None


def spread(total: int, cap: int | None) -> list[int]:
    """`cap` sample indices out of `total`, evenly spread: the first N would keep showing
    one kind of sample (OpInfo lists them grouped), and hide failures in the others."""
    if cap is None or total <= cap:
        return list(range(total))
    return sorted({i * total // cap for i in range(cap)})


def run_entry(op, dtype, max_samples=None, timeout=None, mode="forward",
              run_excluded=False) -> EntryResult:
    """Run `op`'s sample inputs in `dtype` through `mode`: all of them, or `max_samples`
    of them spread evenly over the list. An entry PyTorch's own suite excludes is only
    reported as excluded, unless `run_excluded`: then it is run too, and its outcome kept
    beside the exclusion."""
    name, dname = entry_name(op), str(dtype).removeprefix("torch.")
    reason = unsupported_reason(op, dtype, mode)
    if reason:
        return EntryResult(name, dname, mode, "unsupported", detail=reason)
    reason = excluded_reason(op, dtype, GRADIENT_TESTS if mode == "backward" else TRACING_TESTS)
    if reason and not run_excluded:
        return EntryResult(name, dname, mode, "excluded", detail=reason)
    runner = run_backward if mode == "backward" else run_forward
    counts = {"pass": 0, "fail": 0, "refused": 0, "skip": 0}
    first = {}  # outcome -> what the first sample with that outcome said
    total = 0
    try:
        samples = list(op.sample_inputs("cpu", dtype, requires_grad=mode == "backward"))
        total = len(samples)
        for index in spread(total, max_samples):
            try:
                with _time_limit(timeout):
                    status, detail = runner(op, samples[index])
            except _SampleTimeout as e:
                status, detail = "fail", str(e)
            counts[status] += 1
            first.setdefault(status, f"{status} (sample {index}): {detail}"
                             if status in ("fail", "refused") else detail)
    except Exception as e:
        counts["skip"] += 1
        first.setdefault("skip", f"sample generation raised {type(e).__name__}: {e}"[:300])
    if counts["fail"]:
        status = "fail"
    elif counts["refused"]:
        status = "refused"
    elif counts["pass"]:
        status = "pass"
    else:
        status = "no-samples"
    detail = first.get(status if status != "no-samples" else "skip", "")
    if reason:
        return EntryResult(name, dname, mode, "excluded", counts, total, reason,
                           excluded_outcome=status, excluded_detail=detail)
    return EntryResult(name, dname, mode, status, counts, total, detail)


def run_task(task):
    """`run_entry` for (op_db index, dtype name, max_samples, timeout, mode, run_excluded),
    in a worker."""
    from torch.testing._internal.common_methods_invocations import op_db
    index, dtype, max_samples, timeout, mode, run_excluded = task
    op = op_db[index]
    torch.set_num_threads(1)
    try:
        return run_entry(op, DTYPES[dtype], max_samples, timeout, mode, run_excluded)
    except Exception as e:
        return EntryResult(entry_name(op), dtype, mode, "fail",
                           detail=f"harness: {type(e).__name__}: {e}"[:300])


def run_numbered_task(item):
    # Workers are spawned: what they run must live in an importable module, not __main__.
    k, task = item
    return k, run_task(task)


def op_entries(names=None):
    """`op_db` entries, all or those named (by entry name or by op name)."""
    from torch.testing._internal.common_methods_invocations import op_db
    if not names:
        return list(op_db)
    wanted = set(names)
    return [op for op in op_db if entry_name(op) in wanted or op.name in wanted]


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "int64": torch.int64, "bool": torch.bool}
