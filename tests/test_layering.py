"""The import rules of docs/architecture.md, on the whole repository: `bridge` and `wafer`
never import `cstorch` nor each other, `wafer` never imports torch, the bottom of
`cstorch` (the run core, errors, notices, version) imports nothing of `cstorch` above it,
and no module of the three packages is on an import cycle. Imports written inside
functions count, and so does the `__init__.py` of every package an import goes through
(Python runs it first)."""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("cstorch", "bridge", "wafer")
BOTTOM = ("cstorch.run", "cstorch.errors", "cstorch.notices", "cstorch.version")


def _module_name(path: str) -> str:
    name = path[:-3].replace(os.sep, ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def _modules(root: str) -> dict:
    found = {}
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(root, package)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(folder, f)
                    found[_module_name(os.path.relpath(path, root))] = path
    return found


def _imported(node, module: str, is_package: bool) -> list:
    """Every module name an import statement makes Python import."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")[:None if is_package else -1]
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph(root: str) -> dict:
    """module -> {imported module of the three packages or a third party root: line}."""
    modules = _modules(root)
    graph = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        tree = ast.parse(open(path).read(), path)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported(node, module, path.endswith("__init__.py")):
                parts = name.split(".")
                # the packages an import goes through run first, except this module's own
                for k in range(1, len(parts) + 1):
                    target = ".".join(parts[:k])
                    own = module == target or module.startswith(target + ".")
                    if target in modules and not own:
                        edges.setdefault(target, node.lineno)
                    elif k == 1 and target not in PACKAGES:
                        edges.setdefault(target, node.lineno)
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def _under(module: str, roots) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def violations(root: str) -> list:
    """Every broken rule, as readable lines."""
    graph = import_graph(root)
    out = []
    for module, edges in sorted(graph.items()):
        for target, line in sorted(edges.items()):
            where = f"{module} (line {line}) imports {target}"
            if _under(module, ("bridge",)) and _under(target, ("cstorch", "wafer")):
                out.append(f"{where}: bridge never imports cstorch or wafer")
            if _under(module, ("wafer",)) and _under(target, ("cstorch", "bridge", "torch")):
                out.append(f"{where}: wafer never imports cstorch, bridge or torch")
            if (_under(module, BOTTOM) and _under(target, ("cstorch",))
                    and not _under(target, BOTTOM)):
                out.append(f"{where}: the bottom of cstorch imports nothing above it")
    for component in _cycles(graph):
        out.append("import cycle: " + " -> ".join(component))
    return out


def test_the_repository_keeps_the_import_rules():
    assert violations(ROOT) == []


def _fake_repository(tmp_path, files: dict) -> str:
    for package in PACKAGES + ("cstorch/run",):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize("files, broken", [
    ({"bridge/lower.py": "def f():\n    import cstorch.state\n", "cstorch/state.py": ""},
     "bridge never imports cstorch"),
    ({"bridge/lower.py": "from wafer import mesh\n", "wafer/mesh.py": ""},
     "bridge never imports cstorch or wafer"),
    ({"wafer/mesh.py": "import torch\n"}, "wafer never imports"),
    ({"wafer/mesh.py": "def f():\n    from bridge import lower\n", "bridge/lower.py": ""},
     "wafer never imports"),
    ({"cstorch/run/current.py": "def f():\n    from cstorch.tracing import step\n",
      "cstorch/tracing.py": ""}, "the bottom of cstorch imports nothing above it"),
    # a cycle held together by an import inside a function
    ({"cstorch/state.py": "def f():\n    from cstorch.tracing import capture\n",
      "cstorch/tracing.py": "import cstorch.state\n"}, "import cycle"),
    # a cycle through a package's __init__.py
    ({"cstorch/backend.py": "from cstorch.utils import x\n",
      "cstorch/utils/__init__.py": "from cstorch.utils import steps\n",
      "cstorch/utils/x.py": "", "cstorch/utils/steps.py": "import cstorch.backend\n"},
     "import cycle"),
])
def test_a_forbidden_import_is_found(tmp_path, files, broken):
    for name in files:
        (tmp_path / os.path.dirname(name)).mkdir(parents=True, exist_ok=True)
    root = _fake_repository(tmp_path, files)
    found = violations(root)
    assert any(broken in v for v in found), found


def test_allowed_imports_are_not_flagged(tmp_path):
    root = _fake_repository(tmp_path, {
        "cstorch/state.py": "import bridge\nfrom cstorch.run import current\n",
        "bridge/lower.py": "import jax\nimport torch\n", "wafer/mesh.py": "import jax\n",
        "cstorch/run/current.py": "from cstorch.errors import X\n", "cstorch/errors.py": ""})
    assert violations(root) == []


def test_modules_import_first_in_a_fresh_process():
    """Any order works: modules at the bottom and at the ends of former cycles, each
    imported before anything else of the project, in a process of its own."""
    firsts = ["cstorch.run.current", "cstorch.state", "cstorch.tracing.capture",
              "cstorch.storage.writer", "cstorch.utils.data.executor", "cstorch.sparse.group",
              "bridge.convert", "wafer.compile"]
    failed = []
    for start in range(0, len(firsts), 4):   # a few at a time: each loads torch and jax
        batch = firsts[start:start + 4]
        runs = [subprocess.Popen([sys.executable, "-c", f"import {name}"], cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for name in batch]
        for name, run in zip(batch, runs):
            _, err = run.communicate(timeout=600)
            if run.returncode:
                failed.append(f"{name}: {err.strip().splitlines()[-1]}")
    assert failed == []
