"""Warm start: a captured and compiled step kept in the backend's `compile_dir`, which a new
process runs without capturing the step again.

A stored program is found by a key made before any capture, from everything the program
depends on that a new process can see without running the step: the versions of Python,
torch, jax, jaxlib and NumPy, the content of this project's source, the step function
(module, name, code), the backend (type, devices, mesh, XLA flags), the state layout
(every entry's name and cell, every cell's shape and dtype), the module classes, the
optimizers' classes, which parameters hold a gradient, and everything the in-process
program key holds (`ProgramCache.key`: the call's arguments, tensors by shape and dtype and
other values by value, train/eval and `requires_grad` flags, the optimizers' settings,
precision and debug settings, the default and autocast dtypes), and the Python values the
step may read (`python_values`), by value. The entry found then holds what every source
file loaded at the capture held (the user's script and model files by content hash, an
installed library's files by size and modification time; `__main__` without a file, as
under `python -c` or in a notebook, by the code of its functions and classes); the
program is taken only while each still holds that. Code of torch, jax, NumPy, the
standard library and this project is covered by the versions and the project's hash.
Every loaded file is a superset of the code that ran: an edit anywhere in them captures
again, which costs a capture, never a wrong program.

A program that depends on what the store cannot see again is not stored, and a debug log
says why: step closures and hooks (user functions called by the program's caller), host
tensors the step closes over (their values are in the program), Python values watched by
identity (a tensor, a bound method), micro-batched and multi-process steps, the debug
checks, and compile_only, validate_only and drop_data backends. An entry that cannot be
read warns and the step is captured again, replacing it.
"""
import enum
import functools
import hashlib
import logging
import os
import pickle
import sys
import sysconfig
import types
import warnings

import jax
import jaxlib
import numpy as np
import torch
import torch.utils._pytree as pytree

import wafer
from bridge.device_tensor import GradSource
from cstorch.tracing import hooks
from cstorch.tracing.arguments import Results
from cstorch.tracing.capture import python_values_of
from cstorch.tracing.program import Program

log = logging.getLogger("cstorch")

FORMAT = 1
_SUBDIR = "cstorch-steps"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PROJECT_PACKAGES = ("cstorch", "bridge", "wafer", "cerebras")


class Unstorable(Exception):
    """Why a program cannot be stored or looked up soundly."""


def versions() -> tuple:
    """The versions the key holds for the code it does not hash file by file."""
    return (sys.version, torch.__version__, jax.__version__, jaxlib.__version__,
            np.__version__, project_digest())


@functools.cache
def project_digest() -> str:
    """A hash of this project's source: every file of its packages."""
    h = hashlib.sha256()
    for package in _PROJECT_PACKAGES:
        for folder, dirs, files in sorted(os.walk(os.path.join(_ROOT, package))):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    h.update(os.path.relpath(path, _ROOT).encode())
                    with open(path, "rb") as f:
                        h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


@functools.cache
def _versioned_roots() -> tuple:
    """Folders whose code the versions cover: the standard library, torch, jax, jaxlib,
    NumPy, and this project."""
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    roots |= {os.path.dirname(m.__file__) for m in (torch, jax, jaxlib, np)}
    roots |= {os.path.join(_ROOT, p) for p in _PROJECT_PACKAGES}
    return tuple(os.path.realpath(r) + os.sep for r in roots)


def source_digests() -> dict:
    """{file: what it holds} for the source of every module loaded now that `versions`
    does not cover: a content hash for the user's files, size and modification time for an
    installed library's (its version); the code of `__main__`'s functions and classes
    where it has no file (`python -c`, a notebook)."""
    roots = _versioned_roots()
    out = {}
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not name or name in out or os.path.realpath(name).startswith(roots):
            continue
        out[name] = _file_digest(name)
    main = sys.modules.get("__main__")
    if main is not None and not getattr(main, "__file__", None):
        out["<__main__>"] = _main_digest(main)
    return out


def _file_digest(name: str) -> str:
    """What a source file holds: its content's hash; size and modification time for an
    installed library's file (which a new version of it replaces)."""
    try:
        if _INSTALLED in name:
            info = os.stat(name)
            return f"{info.st_size}:{info.st_mtime_ns}"
        with open(name, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "unreadable"


_INSTALLED = os.sep + "site-packages" + os.sep


def _main_digest(main) -> str:
    """The code of the functions and classes defined in a `__main__` without a file."""
    h = hashlib.sha256()
    for name, value in sorted(vars(main).items()):
        for code in _codes(value, getattr(main, "__name__", "__main__")):
            h.update(name.encode())
            h.update(_code_digest(code).encode())
    return h.hexdigest()


def _codes(value, module_name, depth=0):
    """The code objects of a function or class defined in `module_name`."""
    if isinstance(value, functools.partial):
        value = value.func
    value = getattr(value, "__wrapped__", value)
    if isinstance(value, types.FunctionType):
        if value.__module__ == module_name:
            yield value.__code__
    elif isinstance(value, type) and value.__module__ == module_name and depth < 4:
        for attr in vars(value).values():
            attr = getattr(attr, "__func__", attr)   # staticmethod, classmethod
            yield from _codes(attr, module_name, depth + 1)


# Values in keys --------------------------------------------------------------------------

def stable(value):
    """`value` (a part of a program key) as plain data that another process makes alike
    for an equal value; Unstorable for what is compared by identity there."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return ("float", repr(value))
    if isinstance(value, (tuple, list)):
        if len(value) == 2 and value[0] == "id":
            raise Unstorable("an argument or setting is compared by identity")
        return (type(value).__name__, [stable(v) for v in value])
    if isinstance(value, (set, frozenset)):
        return ("set", sorted(repr(stable(v)) for v in value))
    if isinstance(value, dict):
        return ("dict", [(stable(k), stable(v)) for k, v in value.items()])
    if isinstance(value, (torch.dtype, torch.device, np.dtype)):
        return (type(value).__name__, str(value))
    if isinstance(value, (np.number, np.bool_)):
        return (type(value).__name__, repr(value))
    if isinstance(value, enum.Enum):
        return ("enum", _name_of(type(value)), value.name)
    if isinstance(value, type):
        return ("class", _name_of(value))
    if isinstance(value, types.CodeType):
        return ("code", value.co_filename, value.co_qualname, value.co_firstlineno,
                _code_digest(value))
    if isinstance(value, types.BuiltinFunctionType):
        return ("builtin", getattr(value, "__module__", None), value.__qualname__)
    if isinstance(value, types.FunctionType):
        if id(value) in _functions_open:   # a recursive closure: named by its code only
            return ("function", stable(value.__code__))
        _functions_open.add(id(value))
        try:
            cells = [_cell_value(c) for c in (value.__closure__ or ())]
            return ("function", stable(value.__code__), [stable(c) for c in cells])
        finally:
            _functions_open.discard(id(value))
    if isinstance(value, pytree.TreeSpec):
        return ("treespec", str(value))
    if isinstance(value, torch.Size):
        return ("size", list(value))
    raise Unstorable(f"a value of type {type(value).__name__} in the program's key is compared "
                     f"by identity")


# The functions `stable` is describing, outermost first: a closure that holds itself (a
# recursive inner function) would otherwise be described without end.
_functions_open: set = set()


def _cell_value(cell):
    try:
        return cell.cell_contents
    except ValueError:   # a cell not yet filled
        return ("empty cell",)


def _name_of(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _code_digest(code) -> str:
    h = hashlib.sha256(code.co_code)
    h.update(repr([c if not isinstance(c, types.CodeType) else _code_digest(c)
                   for c in code.co_consts]).encode())
    h.update(repr(code.co_names).encode())
    return h.hexdigest()


def watched(python_values) -> list:
    """The watched Python values (`Program.python_values`), by name and value."""
    return sorted((w[1], repr(stable(w[3]))) for w in python_values)


def key(step_fn, backend, program_key, python_values) -> str:
    """The store's key for a program of `step_fn` under `program_key` (`ProgramCache.key`,
    whose state version is replaced by the state layout), also keyed by which parameters
    hold a gradient (the program's inputs)."""
    state = backend.state
    fn = getattr(step_fn, "__func__", step_fn)
    owner = getattr(step_fn, "__self__", None)
    layout = ([(e.name, e.cell) for e in state.entries],
              [(tuple(c.array.shape), str(c.array.dtype)) for c in state.cells])
    mesh = backend.mesh
    parts = (
        FORMAT, versions(),
        (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None),
         stable(fn.__code__) if hasattr(fn, "__code__") else None,
         _name_of(type(owner)) if owner is not None else None),
        (str(backend.backend_type), backend.params.get("mixed_precision"),
         [(d.platform, d.device_kind, d.id) for d in backend.devices],
         list(mesh.axis_names), list(mesh.devices.shape),
         os.environ.get("XLA_FLAGS", ""), bool(jax.config.jax_enable_x64),
         str(jax.config.jax_default_matmul_precision)),
        layout,
        [(name, _name_of(type(m))) for name, m in state.named_modules()],
        [_name_of(type(o)) for o in backend.optimizers],
        [(p, _name_of(type(h))) for p, h in state.holders],
        torch.is_grad_enabled(),
        [e.tensor.has_grad() for e in state.entries if e.tensor.requires_grad],
        stable([p for i, p in enumerate(program_key) if i != 1]),
        watched(python_values),
        bound_objects(step_fn, backend),
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def bound_objects(step_fn, backend) -> list:
    """Which of the run's modules and optimizers the step reaches through its closure
    variables, the globals its code names (and those of the functions it names, a few
    levels deep) and the attributes of the object it is bound to, by their names in the
    run: two steps of the same code over different models are different programs.
    Unstorable where such a variable holds a module or optimizer the run does not know."""
    state = backend.state
    names = {id(m): n for n, m in state.named_modules()}
    names.update({id(o): o._prefix for o in backend.optimizers})
    out, seen = [], set()

    def note(label, value):
        if id(value) in names:
            out.append((label, names[id(value)]))
        elif isinstance(value, (torch.nn.Module, torch.optim.Optimizer)):
            raise Unstorable(f"{label} holds a module or optimizer that is not state of the run")

    def visit(fn, depth):
        fn = getattr(fn, "__func__", fn)
        if not isinstance(fn, types.FunctionType) or fn.__code__ in seen or depth > 3:
            return
        seen.add(fn.__code__)
        for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:   # a cell not filled yet
                continue
            note(f"{fn.__qualname__}.{var}", value)
            visit(value, depth + 1)
        codes, globs = [fn.__code__], fn.__globals__
        while codes:
            code = codes.pop()
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
            for name in code.co_names:
                if name in globs:
                    note(f"{fn.__module__}.{name}", globs[name])
                    visit(globs[name], depth + 1)
    owner = getattr(step_fn, "__self__", None)
    if owner is not None:
        for attr, value in sorted(vars(owner).items()) if hasattr(owner, "__dict__") else ():
            note(f"self.{attr}", value)
    visit(step_fn, 0)
    return out


# What a program cannot be stored with ------------------------------------------------------

def why_not_stored(program, backend):
    """Why `program` cannot be stored and taken by another process, or None."""
    if backend.distributed:
        return "a multi-process step"
    if not backend.executes or backend.drops_data:
        return f"the backend is {backend.drops_data}"
    if program.closures:
        return "it calls step closures, user functions the store cannot check"
    if program.constants:
        return "it closes over host tensors, whose values it holds"
    if program.micro_batch_size is not None or program.explored is not None:
        return "a micro-batched step"
    if program.finite_check is not None or program.index_checks is not None:
        return "debug.check_finite or check_indices is on"
    if program.hooks is not None and program.hooks.tables:
        return "the step runs hooks (user functions the store cannot check)"
    return None


# The store ------------------------------------------------------------------------------

def _path(directory, digest):
    return os.path.join(directory, _SUBDIR, digest + ".pkl")


_META = ("names", "grad_inputs", "grad_outputs", "grad_rule", "hyper", "results",
         "out_dtypes", "out_shapes", "uses_rng", "grad_layout", "unread_grads", "held_results", "used",
         "slots")


def store(directory, digest, program, sources: dict):
    """Write `program` under `digest`, with the content hashes of the source it ran."""
    meta = {k: getattr(program, k) for k in _META}
    results = program.results
    try:
        meta["results"] = (pytree.treespec_dumps(results.spec), results.leaves, results.positions)
    except Exception as e:   # a container type torch cannot name
        raise Unstorable(f"its results' structure cannot be written ({e})") from None
    entry = pickle.dumps({"format": FORMAT, "sources": sources, "meta": meta,
                          "step": wafer.stored.dumps(program.compiled)})
    path = _path(directory, digest)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "wb") as f:
        f.write(entry)
    os.replace(partial, path)   # a reader sees the whole entry or none


def load(directory, digest, backend, python_values):
    """The program stored under `digest`, or None: none stored, its source changed since
    (logged), or an entry that cannot be read (a warning)."""
    path = _path(directory, digest)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        warnings.warn(f"cstorch: the stored step {path} cannot be read ({e}); capturing the "
                      f"step again", stacklevel=4)
        return None
    try:
        entry = pickle.loads(data)
        if entry.get("format") != FORMAT:
            raise ValueError(f"format {entry.get('format')!r}, expected {FORMAT}")
        changed = [f for f, h in entry["sources"].items() if _current_digest(f) != h]
        if changed:
            log.info("cstorch: the stored step %s is not taken: %s changed since it was "
                     "captured", digest[:12], ", ".join(sorted(changed)[:3]))
            return None
        compiled = wafer.stored.loads(entry["step"], backend.mesh)
        meta = dict(entry["meta"])
        spec, leaves, positions = meta["results"]
        meta["results"] = Results(pytree.treespec_loads(spec), leaves, positions)
    except Exception as e:   # whatever a damaged file gives: never worse than a capture
        warnings.warn(f"cstorch: the stored step {path} is damaged or from another version "
                      f"({type(e).__name__}: {e}); capturing the step again", stacklevel=4)
        return None
    state = backend.state
    params = (e.tensor for e in state.entries if e.tensor.requires_grad)
    return Program(
        graph=None, jax_fn=None, compiled=compiled, closures=[], grad_source=GradSource(),
        python_values=python_values,
        hooks=hooks.Hooks((m for _, m in state.named_modules()), params, backend.optimizers),
        **meta)


def _current_digest(name):
    if name == "<__main__>":
        main = sys.modules.get("__main__")
        return _main_digest(main) if main is not None else None
    return _file_digest(name)


def capture_or_load(steps, backend, call, program_key, capture):
    """(program, whether it was taken from `compile_dir`): the stored program for this
    call, or `capture()`'s, stored for the next process where it can be. `steps` is the
    step's `ProgramCache` (its step function, name and key)."""
    # The backend's own compile_dir: XLA's cache directory, once set, stays set for the
    # process, also for later backends that named none.
    directory = backend.compile_dir
    name = steps.name
    if directory is None or backend.retrace_every_iteration:
        return capture(), False
    state = backend.state
    params = (e.tensor for e in state.entries if e.tensor.requires_grad)
    if hooks.Hooks((m for _, m in state.named_modules()), params, backend.optimizers).tables:
        # Only steps that run no hooks are stored: one stored before a hook was registered
        # would run without it.
        log.debug("cstorch: %s is not looked up in compile_dir: the run has hooks", name)
        return capture(), False
    try:
        digest = key(steps.step_fn, backend, program_key,
                     python_values_of(steps.step_fn, state.named_modules()))
    except Unstorable as e:
        log.debug("cstorch: %s is not looked up in compile_dir: %s", name, e)
        return capture(), False
    program = load(directory, digest, backend,
                   python_values_of(steps.step_fn, state.named_modules()))
    if program is not None:
        log.info("cstorch: %s taken from compile_dir without a capture", name)
        return program, True
    program = capture()
    reason = why_not_stored(program, backend)
    if reason is None:
        try:
            sources = source_digests()
            digest = key(steps.step_fn, backend, steps.key(backend, call)[0],
                         program.python_values)
            store(directory, digest, program, sources)
        except Unstorable as e:
            reason = str(e)
        except OSError as e:
            reason = f"it could not be written ({e})"
    if reason is not None:
        log.debug("cstorch: %s is not stored in compile_dir: %s", name, reason)
    return program, False
