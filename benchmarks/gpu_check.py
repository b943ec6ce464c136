"""One-shot check of cstorch on a GPU: does it run, does it train as eager PyTorch does, and
how fast is a traced step against eager PyTorch on the same GPU.

    python3 benchmarks/gpu_check.py --platform gpu

(run from the repository root; the repository is put on sys.path, so `PYTHONPATH=.` is not
needed). Results go to `$OUT/gpu_check.json` when the variable OUT is set, else to `--out`
(default ./gpu_check.json); the children's logs go beside it (`gpu_check.log`). A readable
summary is printed at the end.

Every part runs in a fresh subprocess with its own timeout, so that one part failing or
hanging loses no other; a failed part records its error and the tail of its log:

- env: torch and jax versions, `jax.devices()`, `nvidia-smi -L`, and whether a JAX and a
  torch computation both run on the GPU in one process.
- parity-gpu, parity-cpu, parity-torchrun: the data-parallel training of
  tests/distributed/data_parallel_script.py (models and data of tests/distributed/models.py,
  "mlp" and "bn", 5 SGD-momentum steps on the global batch) in one process, on
  `cstorch.backend("GPU")`, on `cstorch.backend("CPU")`, and under `torch.distributed.run
  --nproc_per_node 1` on `cstorch.backend("GPU", enable_distributed=True, dist_backend=
  "nccl")`. Each is compared with eager PyTorch training on the CPU in float32: the largest
  difference of the per-step losses and of every parameter and buffer, relative to the
  largest magnitude of the reference. Nothing is asserted: the numbers are recorded.
- speed: the gpt-small workload of benchmarks/workloads on the GPU: eager PyTorch against
  the cstorch traced step on `cstorch.backend("GPU")`, the loss read every step. First step
  (capture and compilation included), then median and min-max ms/step over timed passes
  after a warm-up pass, the peers taking turns in an order shuffled pass by pass, and the
  median of the per-pass ratios eager/cstorch. torch.compile is tried afterwards as a third
  peer, if the time left allows; if it runs out of time the two-peer results stand.

`--platform cpu --quick` runs the same code without a GPU (to test the script): the
single-process "GPU" runs use the CPU backend, since `cstorch.backend("GPU")` needs a JAX
GPU, while the torchrun run keeps the GPU backend with `dist_backend="gloo"` (CPU devices),
as tests/distributed/test_torchrun.py does.
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
DIST_TESTS = os.path.join(ROOT, "tests", "distributed")
SCRIPT = os.path.abspath(__file__)
WORKLOAD = "gpt-small"
QUICK = (5, 3)           # steps per pass, timed passes with --quick
LOG_TAIL = 4000          # characters of a part's log kept in the JSON when it fails
LOG_KEEP = 200_000       # characters of a part's log appended to the combined log


# --------------------------------------------------------------------------------------
# Children: each part's code, run in its own process (`--child PART`).
# --------------------------------------------------------------------------------------
def say(*words):
    print(f"[{time.strftime('%H:%M:%S')}]", *words, flush=True)


class Emitter:
    """Writes the child's result file whole each time, so that a child killed later still
    leaves what it finished."""

    def __init__(self, path):
        self.path = path

    def __call__(self, result):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, self.path)


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:2000]


def child_env(args, emit):
    result = {"python": sys.version.split()[0], "checks": {}}
    checks = result["checks"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        result["nvidia_smi"] = (out.stdout + out.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        result["nvidia_smi"] = f"unavailable: {_error(e)}"
    # torch first, then jax: the order cstorch imports them in, which decides whose copy
    # of a shared CUDA library (cuDNN, cuBLAS, NCCL) the process loads.
    import torch
    result["torch"] = torch.__version__
    result["torch_cuda"] = torch.version.cuda
    result["torch_cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        result["torch_device"] = torch.cuda.get_device_name(0)
        result["torch_capability"] = list(torch.cuda.get_device_capability(0))
        result["torch_cudnn"] = torch.backends.cudnn.version()
    import jax
    import jax.numpy as jnp
    result["jax"] = jax.__version__
    try:
        import jaxlib
        result["jaxlib"] = jaxlib.__version__
    except Exception as e:  # noqa: BLE001 - recorded
        result["jaxlib"] = _error(e)
    result["jax_platforms_env"] = os.environ.get("JAX_PLATFORMS")
    from importlib import metadata
    result["packages"] = {}
    for name in ("jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "triton",
                 "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas", "numpy",
                 "ml_dtypes", "orbax-checkpoint", "h5py", "hdf5plugin"):
        try:
            result["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    emit(result)
    try:
        result["jax_devices"] = [repr(d) for d in jax.devices()]
        result["jax_default_backend"] = jax.default_backend()
    except Exception as e:  # noqa: BLE001 - recorded
        result["jax_devices"] = _error(e)
    emit(result)
    try:
        checks["jax_sum"] = float(jnp.arange(1000, dtype=jnp.float32).sum())
        a = jnp.ones((512, 512), jnp.float32)
        checks["jax_matmul"] = float((a @ a)[0, 0])
        checks["jax_array_device"] = repr(next(iter(a.devices())))
    except Exception as e:  # noqa: BLE001 - recorded
        checks["jax"] = _error(e)
    if torch.cuda.is_available():
        try:
            t = torch.ones(512, 512, device="cuda")
            checks["torch_cuda_matmul"] = float((t @ t)[0, 0])
        except Exception as e:  # noqa: BLE001 - recorded
            checks["torch_cuda"] = _error(e)
    try:
        result["jax_environment"] = jax.print_environment_info(return_string=True)
    except Exception as e:  # noqa: BLE001 - recorded
        result["jax_environment"] = _error(e)
    try:
        import cerebras.pytorch as cstorch
        result["cstorch"] = cstorch.__version__
    except Exception as e:  # noqa: BLE001 - recorded
        result["cstorch"] = _error(e)
    result["complete"] = True
    emit(result)


def _dist_models():
    if DIST_TESTS not in sys.path:
        sys.path.insert(0, DIST_TESTS)
    import models
    return models


def _eager_reference(kind, device="cpu"):
    """Eager PyTorch on the whole global batch with torch's own SGD."""
    import torch
    m = _dist_models()
    torch.manual_seed(0)
    model = m.make_model(kind).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=m.LR, momentum=m.MOMENTUM)
    losses = []
    for x, y in m.global_batches(kind):
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "state": {k: v.cpu().tolist() for k, v in model.state_dict().items()}}


def _cstorch_train(kind, make_backend, rank=0, world=1):
    """The training of data_parallel_script.train, on the backend `make_backend()` makes
    (made before the model, as there); each process passes its shard of the global batch."""
    import torch

    m = _dist_models()
    backend = make_backend()
    torch.manual_seed(0)
    model = m.make_model(kind)
    start = time.perf_counter()
    losses = m.train_cstorch(model, backend, kind, rank, world)
    return {"losses": losses, "state": {k: v.tolist() for k, v in model.state_dict().items()},
            "backend": repr(backend), "devices": [repr(d) for d in backend.devices],
            "seconds": time.perf_counter() - start}


def _parity(args, emit, backend_type, backend_kwargs, rank=0, world=1, note=None):
    import torch

    import cerebras.pytorch as cstorch
    artifacts = os.path.join(args.work, f"artifacts-{args.child}")
    result = {"backend_type": backend_type, "backend_kwargs": backend_kwargs, "note": note,
              "torch": torch.__version__, "kinds": {}}
    for kind in ("mlp", "bn"):
        say(f"{args.child}: {kind} on cstorch.backend({backend_type!r}, {backend_kwargs})")
        run = _cstorch_train(kind, lambda: cstorch.backend(
            backend_type, artifact_dir=artifacts, **backend_kwargs), rank, world)
        run["eager_cpu"] = _eager_reference(kind)
        if args.platform == "gpu" and torch.cuda.is_available() and args.child == "parity-gpu":
            # How far torch's own CUDA kernels are from its CPU ones: the scale against
            # which the cstorch GPU differences can be read.
            try:
                run["eager_cuda"] = _eager_reference(kind, "cuda")
            except Exception as e:  # noqa: BLE001 - recorded
                run["eager_cuda"] = {"error": _error(e)}
        result["kinds"][kind] = run
        say(f"{args.child}: {kind} losses {run['losses']}")
        emit(result)
    result["complete"] = True
    emit(result)


def child_parity_gpu(args, emit):
    if args.platform == "gpu":
        _parity(args, emit, "GPU", {})
    else:
        _parity(args, emit, "CPU", {}, note="no GPU: the CPU backend stands in for the GPU one")


def child_parity_cpu(args, emit):
    _parity(args, emit, "CPU", {})


def child_parity_torchrun(args, emit):
    """Run by torch.distributed.run (one process): the multi-process GPU backend."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # A file rendezvous, as data_parallel_script.py uses, instead of torchrun's env://.
    init_method = "file://" + os.path.join(args.work, "rendezvous")
    dist_backend = "nccl" if args.platform == "gpu" else "gloo"
    _parity(args, emit, "GPU", {"enable_distributed": True, "dist_backend": dist_backend,
                                "init_method": init_method}, rank=rank, world=world)


def _time_first(run, batch):
    start = time.perf_counter()
    loss = run(*batch, True)
    float(loss.detach() if hasattr(loss, "detach") else loss)
    return time.perf_counter() - start


def _timed_passes(runs, data, repeats, out):
    """`repeats` passes over `data` per peer, taking turns in an order shuffled pass by
    pass (random.Random(0)): a slow spell of the machine, or a peer slowed by the one
    before it, is not charged to one peer alone."""
    import random

    from benchmarks.mlp_step import one_pass
    shuffle = random.Random(0).shuffle
    ms = {name: [] for name in runs}
    last = {}
    for i in range(repeats):
        order = list(runs)
        shuffle(order)
        for name in order:
            def keep(*a, _name=name):
                last[_name] = loss = runs[_name](*a)
                return loss
            ms[name].append(one_pass(keep, data, 1))
        say(f"speed: pass {i + 1}/{repeats}: "
            + ", ".join(f"{n} {ms[n][-1]:.2f} ms" for n in runs))
    for name in runs:
        out[name]["ms"] = ms[name]
        out[name]["loss"] = float(last[name].detach() if hasattr(last[name], "detach")
                                  else last[name])
    return ms


def _stats(ms):
    import statistics
    return {"median": statistics.median(ms), "min": min(ms), "max": max(ms)}


def _ratio(num, den):
    import statistics
    r = [a / b for a, b in zip(num, den)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r)}


def child_speed(args, emit):
    import copy

    import torch

    from cstorch.backend import current_backend_impl
    from benchmarks import peers, workloads
    from benchmarks.harness import count_flops
    from benchmarks.mlp_step import one_pass
    started = time.monotonic()
    deadline = started + args.time_left
    wl = workloads.load(WORKLOAD)
    steps, repeats = QUICK if args.quick else wl.SIZES["full"]
    steps, repeats = args.steps or steps, args.repeats or repeats
    gpu = args.platform == "gpu"
    device = torch.device("cuda" if gpu else "cpu")
    base = wl.make_model()
    data = wl.batches(steps)
    result = {"workload": WORKLOAD, "title": wl.TITLE, "steps": steps, "repeats": repeats,
              "device": str(device), "torch": torch.__version__,
              "params": sum(p.numel() for p in base.parameters()),
              "flops_per_step": count_flops(wl, copy.deepcopy(base), data[0]),
              "peers": {}}
    if gpu:
        result["torch_device"] = torch.cuda.get_device_name(0)
        # Both peers compute matmuls in full float32 unless torch is told otherwise
        # (cstorch lowers them at Precision.HIGHEST): recorded so that a TF32 eager peer
        # would show.
        for key, read in (("allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                          ("fp32_precision", lambda: torch.backends.cuda.matmul.fp32_precision),
                          ("float32_matmul_precision", torch.get_float32_matmul_precision)):
            try:
                result[f"torch_{key}"] = read()
            except Exception as e:  # noqa: BLE001 - the names move between torch releases
                result[f"torch_{key}"] = _error(e)
    out = result["peers"]

    def on_device(run):
        # Batches come from the host each step for both peers: cstorch takes host tensors
        # and copies them to the GPU itself, so eager does the same copy. The default
        # device is set too: TinyGPT makes its causal mask with torch.ones in forward.
        def moved(*a):
            *batch, read = a
            with device:
                return run(*[t.to(device) for t in batch], read)
        return moved

    # cstorch first: one backend per process, made before the other peers allocate.
    step = peers.cstorch_step(wl, copy.deepcopy(base), "GPU" if gpu else "CPU",
                              os.path.join(args.work, "artifacts-speed"))
    result["backend"] = repr(current_backend_impl())

    runs = {"cstorch": peers.reading(step),
            "eager": on_device(peers.eager(wl, copy.deepcopy(base).to(device)))}
    for peer, run in runs.items():
        say(f"speed: {peer}: first step")
        out[peer] = {"first_step_s": _time_first(run, data[0])}
        if peer == "cstorch":
            try:
                import bridge
                import wafer
                c, w = bridge.capture_stats, wafer.compile_stats
                out[peer]["first_step_parts_s"] = {
                    "capture": c.tracing_seconds, "lowering": w.lowering_seconds,
                    "xla_compile": w.seconds, "artifacts": w.artifact_seconds}
            except Exception as e:  # noqa: BLE001 - recorded
                out[peer]["first_step_parts_s"] = _error(e)
        say(f"speed: {peer}: first step {out[peer]['first_step_s']:.2f} s; warm-up pass")
        out[peer]["warmup_ms"] = one_pass(run, data, 1)
        emit(result)
    ms = _timed_passes(runs, data, repeats, out)
    out["cstorch"]["captures"] = step.captures
    for peer in runs:
        out[peer].update(_stats(ms[peer]))
        out[peer]["tflops"] = result["flops_per_step"] / (out[peer]["median"] / 1e3) / 1e12
    result["eager_over_cstorch"] = _ratio(ms["eager"], ms["cstorch"])
    e, c = out["eager"]["loss"], out["cstorch"]["loss"]
    # Same batches, same number of steps: the last losses should agree closely.
    result["last_loss_rel_diff"] = abs(e - c) / max(abs(e), 1e-12)
    result["complete"] = True
    emit(result)

    # Optional: torch.compile as a third peer. It can take minutes to compile; if the
    # parent's timeout kills this process meanwhile, the results above stand.
    left = deadline - time.monotonic()
    if args.no_compile:
        result["torch_compile"] = {"skipped": "--no-compile"}
    elif left < args.compile_min_s:
        result["torch_compile"] = {"skipped": f"{left:.0f} s left, under {args.compile_min_s} s"}
    else:
        result["pending"] = "torch-compile"
        emit(result)
        three = {"eager": {}, "cstorch": {}, "torch-compile": {}}
        result["torch_compile"] = three
        try:
            run = on_device(peers.torch_compile(wl, copy.deepcopy(base).to(device)))
            say(f"speed: torch-compile: first step ({left:.0f} s left)")
            three["torch-compile"]["first_step_s"] = _time_first(run, data[0])
            say(f"speed: torch-compile: first step {three['torch-compile']['first_step_s']:.2f} s;"
                " warm-up pass")
            three["torch-compile"]["warmup_ms"] = one_pass(run, data, 1)
            runs["torch-compile"] = run
            ms = _timed_passes(runs, data, repeats, three)
            for peer in runs:
                three[peer].update(_stats(ms[peer]))
            three["eager_over_torch_compile"] = _ratio(ms["eager"], ms["torch-compile"])
            three["torch_compile_over_cstorch"] = _ratio(ms["torch-compile"], ms["cstorch"])
            three["eager_over_cstorch"] = _ratio(ms["eager"], ms["cstorch"])
        except Exception as e:  # noqa: BLE001 - optional peer: recorded
            traceback.print_exc()
            three["error"] = _error(e)
        del result["pending"]
    emit(result)


CHILDREN = {"env": child_env, "parity-gpu": child_parity_gpu, "parity-cpu": child_parity_cpu,
            "parity-torchrun": child_parity_torchrun, "speed": child_speed}


# --------------------------------------------------------------------------------------
# Parent: runs the parts, each in a subprocess with a timeout, and writes the JSON.
# --------------------------------------------------------------------------------------
class Part:
    def __init__(self, name, cap_s, launch="python", jax_cpu=False):
        self.name, self.cap_s, self.launch, self.jax_cpu = name, cap_s, launch, jax_cpu
        self.proc = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_for(part, args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # Processes may share the GPU (parity-cpu runs beside the others, eager torch beside
    # JAX in one process): JAX must not take 75% of its memory up front.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.pop("JAX_PLATFORMS", None)
    if part.launch == "torchrun":
        # As tests/distributed/test_torchrun.py: no JAX_PLATFORMS, the process group picks
        # the platform from dist_backend (gloo: cpu, nccl: gpu).
        pass
    elif args.platform == "cpu" or part.jax_cpu:
        env["JAX_PLATFORMS"] = "cpu"
    if args.platform == "cpu" or part.jax_cpu:
        # Nothing of a CPU run should touch a GPU if the machine has one.
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _start(part, args, work, time_left):
    result = os.path.join(work, f"{part.name}.json")
    log = os.path.join(work, f"{part.name}.log")
    child = [SCRIPT, "--child", part.name, "--platform", args.platform, "--result", result,
             "--work", work, "--time-left", str(time_left),
             "--compile-min-s", str(args.compile_min_s)]
    child += ["--quick"] * args.quick + ["--no-compile"] * args.no_compile
    child += ["--steps", str(args.steps)] * bool(args.steps)
    child += ["--repeats", str(args.repeats)] * bool(args.repeats)
    if part.launch == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
               "--master_port", str(_free_port()), *child]
    else:
        cmd = [sys.executable, *child]
    part.result_path, part.log_path = result, log
    part.timeout = time_left
    part.started = time.monotonic()
    part.log_file = open(log, "w")
    env = _env_for(part, args)
    part.settings = {k: env.get(k) for k in ("JAX_PLATFORMS", "CUDA_VISIBLE_DEVICES",
                                             "XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS")}
    part.settings["command"] = " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c
                                        for c in cmd[1:])
    # A process group of its own: on timeout the whole group (torchrun's workers, inductor's
    # compile workers) is killed. Not a session of its own: a session would outlive this
    # script if something killed it from outside.
    group = ({"process_group": 0} if sys.version_info >= (3, 11)
             else {"preexec_fn": os.setpgrp})
    part.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=part.log_file,
                                 stderr=subprocess.STDOUT, **group)
    say(f"{part.name}: started (timeout {time_left:.0f} s)")


def _kill(part):
    try:
        os.killpg(part.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _finish(part, log_sink):
    """Waits for the part (up to its timeout) and returns its JSON entry."""
    timed_out = False
    try:
        rc = part.proc.wait(timeout=max(1.0, part.started + part.timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(part)
        rc = part.proc.wait()
    part.log_file.close()
    wall = time.monotonic() - part.started
    with open(part.log_path, errors="replace") as f:
        log = f.read()
    log_sink.write(f"\n===== {part.name} (rc {rc}, {wall:.1f} s) =====\n{log[-LOG_KEEP:]}\n")
    log_sink.flush()
    result = None
    if os.path.exists(part.result_path):
        with open(part.result_path) as f:
            result = json.load(f)
    entry = {"wall_s": round(wall, 2), "rc": rc, "timed_out": timed_out,
             "timeout_s": round(part.timeout, 1), "settings": part.settings}
    complete = bool(result and result.pop("complete", False))
    pending = result.pop("pending", None) if result else None
    entry["ok"] = complete
    if timed_out:
        entry["error"] = f"timed out after {part.timeout:.0f} s" + (
            f" during {pending}" if pending else "")
    elif rc != 0:
        entry["error"] = f"exit code {rc}"
    elif not complete:
        entry["error"] = "the child ended without a complete result"
    if "error" in entry:
        entry["log_tail"] = log[-LOG_TAIL:]
        first = _first_traceback(log)
        if first:
            entry["traceback"] = first
    if pending == "torch-compile" and result is not None:
        result["torch_compile"] = {"error": entry.get("error", "unfinished")}
    entry["result"] = result
    state = "ok" if complete else "FAILED"
    say(f"{part.name}: {state} in {wall:.1f} s" + (f" ({entry['error']})" if "error" in entry
                                                    else ""))
    if not complete:
        shown = entry.get("traceback") or log
        print("\n".join("    | " + line for line in shown[-1500:].splitlines()), flush=True)
    return entry


def _first_traceback(log: str) -> str:
    """The first Python traceback in a part's log, to its exception's message: under
    torchrun the worker's own error comes first, the launcher's report of it after."""
    # torchrun prefixes a worker's error output with "[rank0]: ".
    lines = [re.sub(r"^\[rank\d+\]: ?", "", line) for line in log.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), None)
    if start is None:
        return ""
    end = start + 1
    while end < len(lines) and (not lines[end] or lines[end][0].isspace()):
        end += 1
    # The exception line and the rest of a message spread over several lines.
    stop = end + 1
    while (stop < min(len(lines), end + 12) and lines[stop]
           and not lines[stop].startswith(("Traceback", "[", "During handling", "The above"))
           and not re.match(r"[EWIF]\d{4} ", lines[stop])):   # a C++ (glog) log line
        stop += 1
    return "\n".join(lines[start:stop])[-LOG_TAIL:]


def _rel(got, ref):
    """max |got - ref| / max |ref| (absolute where the reference is all zeros)."""
    import numpy as np
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape:
        return f"shape {list(got.shape)} vs {list(ref.shape)}"
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    return diff / scale if scale > 0 else diff


def _compare(run, ref):
    state = {k: _rel(run["state"][k], v) for k, v in ref["state"].items()}
    numbers = [v for v in state.values() if isinstance(v, float)]
    return {"losses": _rel(run["losses"], ref["losses"]),
            "state_max": max(numbers) if numbers else None, "state": state}


def _parity_diffs(parts):
    """Differences of each parity run against eager CPU float32, and between runs."""
    diffs = {}
    runs = {name: parts[name]["result"]["kinds"] for name in
            ("parity-gpu", "parity-cpu", "parity-torchrun")
            if parts.get(name, {}).get("result") and parts[name]["result"].get("kinds")}
    for name, kinds in runs.items():
        for kind, run in kinds.items():
            d = diffs.setdefault(kind, {})
            d[f"{name} vs eager-cpu"] = _compare(run, run["eager_cpu"])
            cuda = run.get("eager_cuda")
            if cuda and "error" not in cuda:
                d["eager-cuda vs eager-cpu"] = _compare(cuda, run["eager_cpu"])
    for a, b in (("parity-gpu", "parity-cpu"), ("parity-torchrun", "parity-gpu")):
        for kind in set(runs.get(a, {})) & set(runs.get(b, {})):
            diffs[kind][f"{a} vs {b}"] = _compare(runs[a][kind], runs[b][kind])
    return diffs


def _slim_parity(entry):
    """The JSON keeps losses and the differences, not every trained value."""
    result = entry.get("result")
    if not result or "kinds" not in result:
        return
    for run in result["kinds"].values():
        run.pop("state", None)
        for ref in ("eager_cpu", "eager_cuda"):
            if isinstance(run.get(ref), dict):
                run[ref].pop("state", None)


def _summary(report):
    parts = report["parts"]
    s = {"parts_ok": {k: v["ok"] for k, v in parts.items()}}
    env = (parts.get("env") or {}).get("result") or {}
    s["env"] = {k: env.get(k) for k in ("torch", "jax", "jax_devices", "nvidia_smi")}
    s["parity_max_rel_diff"] = {
        kind: {pair: {"losses": d["losses"], "state_max": d["state_max"]}
               for pair, d in pairs.items()}
        for kind, pairs in report.get("parity", {}).items()}
    speed = (parts.get("speed") or {}).get("result")
    if speed and "eager_over_cstorch" in speed:
        s["speed"] = {"workload": speed["workload"], "device": speed["device"],
                      "steps": speed["steps"], "repeats": speed["repeats"],
                      "eager_over_cstorch": speed["eager_over_cstorch"]}
        for peer, p in speed["peers"].items():
            s["speed"][peer] = {k: p.get(k) for k in ("first_step_s", "median", "min", "max")}
        tc = speed.get("torch_compile") or {}
        if "torch-compile" in tc and "median" in tc["torch-compile"]:
            s["speed"]["torch-compile"] = {k: tc["torch-compile"].get(k)
                                           for k in ("first_step_s", "median", "min", "max")}
            s["speed"]["eager_over_torch_compile"] = tc["eager_over_torch_compile"]
            s["speed"]["torch_compile_over_cstorch"] = tc["torch_compile_over_cstorch"]
        else:
            s["speed"]["torch-compile"] = tc.get("error") or tc.get("skipped") or "not run"
    return s


def _fmt(x):
    return f"{x:.2e}" if isinstance(x, float) else str(x)


def _print_summary(report):
    s = report["summary"]
    lines = ["", "===== gpu_check summary =====",
             f"platform {report['platform']}{' (quick)' if report['quick'] else ''}, "
             f"wall {report['wall_s']:.0f} s",
             "parts: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}"
                                   for k, v in s["parts_ok"].items())]
    env = s["env"]
    lines.append(f"torch {env.get('torch')}, jax {env.get('jax')}, "
                 f"devices {env.get('jax_devices')}")
    if env.get("nvidia_smi"):
        lines.append(f"nvidia-smi -L: {env['nvidia_smi']}")
    lines.append("parity: max relative difference (losses / parameters and buffers)")
    for kind, pairs in s["parity_max_rel_diff"].items():
        for pair, d in pairs.items():
            lines.append(f"  {kind:4s} {pair:34s} {_fmt(d['losses'])} / {_fmt(d['state_max'])}")
    sp = s.get("speed")
    if sp:
        lines.append(f"speed: {sp['workload']} on {sp['device']}, ms/step median [min-max] over "
                     f"{sp['repeats']} passes of {sp['steps']} steps")
        for peer in ("eager", "cstorch", "torch-compile"):
            p = sp.get(peer)
            if isinstance(p, dict):
                lines.append(f"  {peer:14s} first step {p['first_step_s']:.2f} s, "
                             f"{p['median']:.2f} [{p['min']:.2f}-{p['max']:.2f}] ms")
            elif p is not None:
                lines.append(f"  {peer:14s} {p}")
        r = sp["eager_over_cstorch"]
        lines.append(f"  eager/cstorch per-pass ratio {r['median']:.2f}x "
                     f"[{r['min']:.2f}-{r['max']:.2f}]")
        if "torch_compile_over_cstorch" in sp:
            r = sp["torch_compile_over_cstorch"]
            lines.append(f"  torch-compile/cstorch per-pass ratio {r['median']:.2f}x "
                         f"[{r['min']:.2f}-{r['max']:.2f}]")
    print("\n".join(lines), flush=True)


def parent(args):
    start = time.monotonic()
    out_path = (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT")
                else os.path.abspath(args.out))
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    log_path = os.path.splitext(out_path)[0] + ".log"
    work = tempfile.mkdtemp(prefix="gpu_check-")
    # Caps in seconds per part, and the time each part needs at least: a part is given
    # what is left of the budget minus what the parts after it are kept.
    slow = 1 if args.platform == "gpu" else 2
    env = Part("env", 60)
    side = Part("parity-cpu", 150 * slow, jax_cpu=True)
    seq = [Part("parity-gpu", 150 * slow), Part("parity-torchrun", 120 * slow, "torchrun"),
           Part("speed", 400 * slow)]
    reserve = {"parity-gpu": 40, "parity-torchrun": 40, "speed": 60}
    report = {"script": "benchmarks/gpu_check.py", "platform": args.platform,
              "quick": args.quick, "argv": sys.argv[1:], "budget_s": args.budget,
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "parts": {}}

    def write():
        report["wall_s"] = round(time.monotonic() - start, 1)
        report["parity"] = _parity_diffs(report["parts"])
        report["summary"] = _summary(report)
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1, default=str)
        os.replace(tmp, out_path)

    def budget_for(part, later):
        left = args.budget - (time.monotonic() - start) - sum(reserve[p.name] for p in later)
        return max(10.0, min(part.cap_s, left))

    say(f"gpu_check: platform {args.platform}, budget {args.budget} s, results {out_path}, "
        f"logs {log_path}, work {work}")
    # Killed from outside (SIGTERM), the parts still running are ended with this script.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with open(log_path, "w") as log_sink:
        try:
            # parity-cpu needs no GPU: it runs beside env and parity-gpu, and is waited for
            # before speed, which must have the machine to itself.
            _start(side, args, work, side.cap_s)
            for i, part in enumerate([env] + seq):
                later = seq[i:] if part is env else seq[seq.index(part) + 1:]
                if part.name == "speed":
                    report["parts"][side.name] = _finish(side, log_sink)
                    write()
                _start(part, args, work, budget_for(part, later))
                report["parts"][part.name] = _finish(part, log_sink)
                write()
        finally:
            for part in [side, env] + seq:
                if part.proc is not None and part.proc.poll() is None:
                    _kill(part)
            shutil.rmtree(work, ignore_errors=True)
    # Parity entries keep their differences (report["parity"]) rather than every value.
    report["parity"] = _parity_diffs(report["parts"])
    for name in ("parity-gpu", "parity-cpu", "parity-torchrun"):
        if name in report["parts"]:
            _slim_parity(report["parts"][name])
    report["wall_s"] = round(time.monotonic() - start, 1)
    report["summary"] = _summary(report)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1, default=str)
    _print_summary(report)
    say(f"gpu_check: wrote {out_path}")
    return 0 if all(p["ok"] for p in report["parts"].values()) else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--platform", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--quick", action="store_true",
                   help=f"fewer steps: {QUICK[1]} passes of {QUICK[0]}")
    p.add_argument("--out", default="gpu_check.json",
                   help="where the JSON goes when the variable OUT is not set")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run (default 290 on gpu, 600 on cpu)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--compile-min-s", type=float, default=None,
                   help="try torch.compile only with this many seconds left (default 60 on "
                        "gpu, 90 on cpu)")
    p.add_argument("--steps", type=int, default=0, help="steps per timed pass")
    p.add_argument("--repeats", type=int, default=0, help="timed passes")
    # Internal: a child runs one part.
    p.add_argument("--child", choices=tuple(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--time-left", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.budget is None:
        args.budget = 290.0 if args.platform == "gpu" else 600.0
    if args.compile_min_s is None:
        args.compile_min_s = 60.0 if args.platform == "gpu" else 90.0
    if args.child:
        say(f"{args.child}: start (pid {os.getpid()})")
        CHILDREN[args.child](args, Emitter(args.result))
        say(f"{args.child}: done")
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
