"""The Markdown report of a conformance run (docs/op-coverage.md)."""
import re
from pathlib import Path

# Text below this line in an existing report is kept: notes written by hand, results of
# other runs.
KEEP_MARKER = "<!-- written by hand below this line; the generator keeps it -->"

TRIED = ("pass", "fail", "refused", "no-samples")


def summary(results):
    """{(mode, dtype): {status: entries, 'samples_run', 'samples_pass', 'samples_all',
    'capped'}}."""
    by = {}
    for r in results:
        c = by.setdefault((r.mode, r.dtype), {})
        c[r.status] = c.get(r.status, 0) + 1
        if r.excluded_outcome:
            c["excluded_run"] = c.get("excluded_run", 0) + 1
            c["excluded_pass"] = c.get("excluded_pass", 0) + (r.excluded_outcome == "pass")
        if r.status in TRIED:
            run = sum(r.samples.values()) if r.samples else 0
            c["samples_run"] = c.get("samples_run", 0) + run
            c["samples_pass"] = c.get("samples_pass", 0) + r.samples.get("pass", 0)
            c["samples_all"] = c.get("samples_all", 0) + r.total_samples
            c["capped"] = c.get("capped", 0) + (r.total_samples > run)
    return by


def cause(detail: str) -> str:
    """A failure's cause, with what differs between entries of the same cause taken out."""
    text = re.sub(r"^(fail|refused) \(sample \d+\): ", "", detail)
    m = re.search(r"no JAX lowering for ATen op (\S+) \(overload '([^']+)'\)", text)
    if m:
        return f"no lowering for {m.group(1)}.{m.group(2)}"
    if "took longer than" in text:
        return "timed out"
    if text.startswith("capture: "):
        text = text[len("capture: "):]
        m = re.search(r"ATen op (aten\.[\w.]+)", text) or re.match(r"\w+: (aten\.[\w.]+)", text)
        if "DataDependentShapeError" in text or "DynamicOutputShape" in text:
            return f"data-dependent output shape ({m.group(1) if m else '?'})"
        if "TensorValueReadError" in text or "DataDependentOutput" in text:
            return "a tensor's value is read while tracing"
        return "tracer: " + text[:70]
    if text.startswith("lowering: "):
        return "lowering: data-dependent output shape"
    if "not close" in text:
        return "values differ from eager"
    if text.startswith("AssertionError: shape"):
        return "shape differs from eager"
    if text.startswith("AssertionError: dtype"):
        return "dtype differs from eager"
    if "inputs with a gradient" in text:
        return "which inputs get a gradient differs from eager"
    m = re.match(r"(\w+): (.*)", text)
    return f"{m.group(1)}: {m.group(2)[:70]}" if m else text[:80]


def with_excluded(c) -> tuple[int, int]:
    """(passed, tried) counting the excluded entries as tried: those run anyway
    (--run-excluded) by their outcome, the others as not passing."""
    tried = sum(c.get(k, 0) for k in TRIED) + c.get("excluded", 0)
    return c.get("pass", 0) + c.get("excluded_pass", 0), tried


def _headline(mode, dtype, c, cap):
    tried = sum(c.get(k, 0) for k in TRIED)
    rate = 100.0 * c.get("pass", 0) / max(tried, 1)
    capped = c.get("capped", 0)
    over = (f"over every sample ({c.get('samples_run', 0)})" if not capped else
            f"**over at most {cap} samples per entry**, spread evenly over its sample list "
            f"({capped} tried entries have more; {c.get('samples_run', 0)} of the tried entries' "
            f"{c.get('samples_all', 0)} samples run)")
    passed, all_tried = with_excluded(c)
    run = c.get("excluded_run", 0)
    excluded = (f"; with the {c.get('excluded', 0)} excluded entries counted "
                f"({run} of them run, the rest counted as failing): {passed} / {all_tried} "
                f"({100.0 * passed / max(all_tried, 1):.1f}%)")
    return (f"- **{mode} {dtype}: {c.get('pass', 0)} / {tried} entries pass ({rate:.1f}%)**, "
            f"{over}{excluded}")


def _table(by):
    lines = ["| mode | dtype | entries | unsupported | excluded | tried | passed | failed | refused "
             "| no-samples | entry pass rate | with excluded counted | samples run / all "
             "| sample pass rate |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (mode, dtype), c in by.items():
        tried = sum(c.get(k, 0) for k in TRIED)
        rate = 100.0 * c.get("pass", 0) / max(tried, 1)
        run, ok = c.get("samples_run", 0), c.get("samples_pass", 0)
        lines.append(
            f"| {mode} | {dtype} | {sum(c.get(k, 0) for k in (*TRIED, 'unsupported', 'excluded'))} "
            f"| {c.get('unsupported', 0)} | {c.get('excluded', 0)} | {tried} | {c.get('pass', 0)} "
            f"| {c.get('fail', 0)} | {c.get('refused', 0)} | {c.get('no-samples', 0)} | {rate:.1f}% "
            f"| {100.0 * with_excluded(c)[0] / max(with_excluded(c)[1], 1):.1f}% "
            f"| {run} / {c.get('samples_all', 0)} | {100.0 * ok / max(run, 1):.1f}% |")
    return lines


def _entry_line(r):
    counts = ", ".join(f"{k} {v}" for k, v in r.samples.items() if v)
    detail = r.detail.replace("|", "/").replace("\n", " ")
    return f"  - `{r.name}` ({counts}): {detail}"


def _section(mode, dtype, results, cap):
    rows = [r for r in results if r.mode == mode and r.dtype == dtype]
    lines = ["", f"## {mode.capitalize()}, {dtype}"]
    for title, status in (("Failed", "fail"), ("Refused", "refused")):
        bad = [r for r in rows if r.status == status]
        lines += ["", f"### {title} ({len(bad)}), by cause", ""]
        groups = {}
        for r in bad:
            groups.setdefault(cause(r.detail), []).append(r)
        for why, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"- {why} ({len(members)})")
            lines += [_entry_line(r) for r in members]
    empty = [r for r in rows if r.status == "no-samples"]
    lines += ["", f"### No usable samples ({len(empty)})", ""]
    lines += [f"- `{r.name}`: {r.detail}" for r in empty]
    capped = [r for r in rows if r.status in TRIED and r.total_samples > sum(r.samples.values())]
    if capped:
        lines += ["", f"### Entries run on {cap} of their samples, spread evenly ({len(capped)})",
                  "", "Each with the number of samples it has:", "",
                  ", ".join(f"`{r.name}` ({r.total_samples})" for r in capped)]
    excluded = [r for r in rows if r.status == "excluded"]
    lines += ["", f"### Excluded: PyTorch's own suite does not run them on CPU ({len(excluded)})",
              ""]
    lines += [f"- `{r.name}`: {r.detail}" + (f"; run anyway: {r.excluded_outcome}"
                                             + (f" ({r.excluded_detail[:200]})"
                                                if r.excluded_outcome != "pass" else "")
                                             if r.excluded_outcome else "")
              for r in excluded]
    unsupported = [r for r in rows if r.status == "unsupported"]
    reasons = {}
    for r in unsupported:
        reasons.setdefault(r.detail, []).append(r.name)
    lines += ["", f"### Not tried: the entry does not support it ({len(unsupported)})", ""]
    lines += [f"- {why} ({len(names)}): " + ", ".join(f"`{n}`" for n in names)
              for why, names in reasons.items()]
    return lines


METHOD = """\
Each `op_db` entry's sample inputs are captured with `bridge.capture`, lowered with
`bridge.lower`, run under `jax.jit` and compared with eager PyTorch on CPU
(`tools/conformance/`). **Forward**: the op's outputs; the sample's tensors are graph
inputs, everything else is baked in. **Backward**: for entries that support autograd in
the dtype, one captured step computes the op, the scalar loss sum_i <output_i, c_i> with
fixed random cotangents c_i, calls `backward()` and returns every input's `.grad`, as
PyTorch's gradient tests do (through the entry's `gradcheck_wrapper` and
`output_process_fn_grad`); each gradient is compared with eager's, and so is which
inputs get one.

- Counting: an entry passes when every sample run passes. `tried` = entries that support
  the dtype (backward: and autograd in it) on CPU, minus excluded; pass rate = passed /
  tried, so `refused` and `no-samples` count against it. "With excluded counted" adds the
  excluded entries to `tried`: with `--run-excluded` they are run and count by their
  outcome; otherwise they count as failing. `refused` = PyTorch's tracer
  produced no graph (data-dependent output shapes, Python values read from tensors) or a
  lowering raised `DataDependentShapeError`; `no-samples` = no sample had anything to
  compare (complex or sparse inputs, eager raised, no output or input in autograd).
  The sample pass rate counts every sample run, skipped ones included.
- Comparison: shape, then dtype as JAX holds eager's (int64 and float64 run as int32 and
  float32 with 64-bit types off), then values within (rtol, atol) = (1e-4, 1e-5) for
  float32. A gradient outside that is held, with eager's, to eager's gradient computed
  in float64, and passes when its largest error is at most eager's own + 1e-7: PyTorch's
  TestDecomp criterion (`op_assert_ref`), for where eager's float32 rounding exceeds the
  tolerance (cancelling terms of a gradient that is exactly 0, say). Correct but
  non-unique forward results go through a rule first: `linalg.eigh` (eigenvalues +
  V diag(w) V^T), `svd` / `linalg.svd` (S + U diag(S) V^T), `matrix_exp` (normwise). An
  op is compared by shape and dtype only when it is random: two eager runs under
  different seeds differ (dropout in training, `rrelu` in training, fractional max
  pooling, the randomized low-rank SVDs, random sampling ops), or it returns
  uninitialised memory (`empty*`, `new_empty*`, `resize_*`). The same op with a
  deterministic sample (dropout with `training=False`, `nn.functional.normalize`) is
  compared by value.
- Exclusions come only from PyTorch's own lists: an entry is excluded when a skip,
  expectedFailure or onlyCUDA decorator of the entry is active on CPU in TestDecomp,
  TestProxyTensorOpInfo (make_fx) or TestFakeTensor, and for backward also in
  TestBwdGradients.test_fn_grad. Tolerance and precision overrides, CUDA/ROCm/XPU-only
  skips, and skips for builds without LAPACK or FFT (this torch has both) do not exclude.
  Each exclusion below gives PyTorch's decorator, its reason text and the test it is on.
"""


def write_report(results, path, command, seconds, cap, not_run=0):
    order = {"forward": 0, "backward": 1}
    by = dict(sorted(summary(results).items(), key=lambda kv: (order.get(kv[0][0], 2), kv[0][1])))
    lines = ["# Op coverage: bridge lowerings vs eager PyTorch on the OpInfo suite", "",
             "Generated by:", "", "```", command, "```", "",
             f"Wall time: {seconds / 60:.1f} min.", ""]
    if not_run:
        lines += [f"**The run was stopped early: {not_run} entry runs were not reached and are "
                  "not counted below.**", ""]
    lines += [_headline(mode, dtype, c, cap) for (mode, dtype), c in by.items()]
    lines += ["", *_table(by), "", METHOD.rstrip()]
    for mode, dtype in by:
        lines += _section(mode, dtype, results, cap)
    kept = ""
    target = Path(path)
    if target.exists():
        old = target.read_text()
        if KEEP_MARKER in old:
            kept = old[old.index(KEEP_MARKER) + len(KEEP_MARKER):]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n\n" + KEEP_MARKER + kept.rstrip("\n") + "\n")
