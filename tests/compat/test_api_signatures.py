"""Every public name of the real cerebras.pytorch 2.10 (../shared/fixtures/api_signatures.json)
exists here at the same import path, of the same kind, with the same parameters: names,
order, kinds (positional, keyword-only, variadic) and defaults. Annotations are not compared.

The only differences allowed are the ones docs/compat.md lists in its table of signature
differences, each with its reason; the test reads that table, so the list and the code
cannot drift apart.
"""
import importlib
import inspect
import json
import pathlib
import re

import pytest

import cerebras.pytorch  # noqa: F401  (installs the cerebras.pytorch alias)

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT.parent / "shared" / "fixtures" / "api_signatures.json"
COMPAT = ROOT / "docs" / "compat.md"


def load_fixture():
    return json.loads(FIXTURE.read_text())


def allowed_differences():
    """Names listed in docs/compat.md's signature table: `| name | what differs | why |`."""
    text = COMPAT.read_text()
    section = text.split("## Signature differences", 1)[1].split("\n## ", 1)[0]
    return {m.group(1) for m in re.finditer(r"^\|\s*`([\w.]+)`\s*\|", section, re.M)}


def resolve(name):
    """The object a user reaches as `name`: attribute access from the package root first
    (`cerebras.pytorch.backend` is the function), then the longest importable module."""
    parts = name.split(".")
    obj = importlib.import_module("cerebras.pytorch")
    try:
        for p in parts[2:]:
            obj = getattr(obj, p)
        return obj
    except AttributeError:
        pass
    for i in range(len(parts), 2, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise AttributeError(name)


def render(fn, drop_first=False):
    """A signature in the fixture's notation: `kw:` marks keyword-only, `*`/`**` variadics,
    defaults as their repr, no annotations."""
    params = list(inspect.signature(fn).parameters.values())
    if drop_first and params and params[0].kind in (params[0].POSITIONAL_ONLY,
                                                    params[0].POSITIONAL_OR_KEYWORD):
        params = params[1:]
    out = []
    for p in params:
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            s = ("kw:" if p.kind is p.KEYWORD_ONLY else "") + p.name
            if p.default is not p.empty:
                s += "=" + repr(p.default)
            out.append(s)
    return "(" + ", ".join(out) + ")"


_ADDRESS = re.compile(r" at 0x[0-9a-f]+>")


def _same(got: str, want: str) -> bool:
    """Signatures equal, a default `object()` sentinel's address aside (its repr names
    a memory address that differs between processes)."""
    return _ADDRESS.sub(" at 0x>", got) == _ADDRESS.sub(" at 0x>", want)


def differences(name, info):
    try:
        obj = resolve(name)
    except (AttributeError, ImportError) as e:
        return [f"missing ({e})"]
    kind = info["kind"]
    if kind == "module":
        return [] if inspect.ismodule(obj) else [f"not a module: {type(obj).__name__}"]
    if kind == "_backends":
        return [] if callable(obj) and hasattr(obj, "csx") else ["not the backends namespace"]
    if kind == "function":
        if not callable(obj) or inspect.isclass(obj):
            return [f"not a function: {type(obj).__name__}"]
        got = render(obj)
        return [] if _same(got, info["sig"]) else [f"signature {got} != {info['sig']}"]
    if not inspect.isclass(obj):
        return [f"not a class: {type(obj).__name__}"]
    probs = []
    got = render(obj.__init__, drop_first=True)
    if not _same(got, info["init"]):
        probs.append(f"__init__{got} != {info['init']}")
    for member, want in info.get("members", {}).items():
        try:
            static = inspect.getattr_static(obj, member)
        except AttributeError:
            probs.append(f"{member}: missing")
            continue
        if want == "property":
            if not isinstance(static, property):
                probs.append(f"{member}: not a property")
            continue
        if isinstance(static, property) or not callable(getattr(obj, member)):
            probs.append(f"{member}: not a method")
            continue
        # The fixture keeps `cls` of a classmethod (`WorkerState.configure(cls, worker_ckpt)`)
        # and drops only the `self` of a plain method.
        bound_first = not isinstance(static, (staticmethod, classmethod))
        fn = static.__func__ if isinstance(static, (staticmethod, classmethod)) else static
        got = render(fn, drop_first=bound_first)
        if not _same(got, want):
            probs.append(f"{member}{got} != {want}")
    return probs


FIXTURE_ITEMS = sorted(load_fixture().items()) if FIXTURE.exists() else []


@pytest.mark.parametrize("name,info", FIXTURE_ITEMS, ids=[n for n, _ in FIXTURE_ITEMS])
def test_public_name_matches_the_real_package(name, info):
    if name in allowed_differences():
        pytest.skip("listed in docs/compat.md with its reason")
    probs = differences(name, info)
    assert not probs, f"{name}: " + "; ".join(probs)


def test_compat_list_names_only_real_differences():
    """An entry in docs/compat.md that no longer differs is stale and must go."""
    fixture = load_fixture()
    for name in allowed_differences():
        assert name in fixture, f"docs/compat.md lists {name}, which is not a public name"
        assert differences(name, fixture[name]), f"docs/compat.md lists {name}, which now matches"


def test_renderer_sees_each_kind_of_difference():
    def f(a, b=1, *args, c, d=None, **kw):
        pass
    assert render(f) == "(a, b=1, *args, kw:c, kw:d=None, **kw)"
    class C:
        def __init__(self, x, y="s"):
            pass
    assert render(C.__init__, drop_first=True) == "(x, y='s')"
    assert differences("cerebras.pytorch.no_such_name", {"kind": "function", "sig": "()"})
