"""Issue 14's acceptance test: every module of Model Zoo's models and trainer imports on
this project's `cerebras.pytorch` and `cerebras.appliance`.

One subprocess imports them all (Model Zoo's `src` on sys.path; `cerebras` is a namespace
package) and reports, as JSON, each module that failed and why. Third-party packages that
Model Zoo imports at module level but whose code no import runs (`STAND_INS`) are stood in
for when they are not installed; modules that need a package outside the test
dependencies to import (`KNOWN_EXCEPTIONS`) must fail with exactly that missing package.
Every other module must import.
"""
import json
import os
import subprocess
import sys

from tests.conftest import ROOT, SHARED

MODELZOO_SRC = os.path.join(SHARED, "modelzoo", "src")
PACKAGES = ("cerebras/modelzoo/models", "cerebras/modelzoo/trainer")

# Imported at module level, used only inside functions that importing never calls.
STAND_INS = (
    "torchvision",    # image datasets and transforms (data processors, vision models)
    "pandas",         # tables in weight-summary and dataset helpers
    "multiprocess",   # a Pool in a helper of common/utils/model/transformer_utils.py
    "requests",       # the trainer's notification callbacks (Slack, e-mail): HTTP posts
    "slack_sdk",      # and their Slack client
)

# module -> the package, outside the test dependencies, whose absence it must fail on.
_MZ = "cerebras.modelzoo."
KNOWN_EXCEPTIONS = {
    # through its data processor, which needs six (in the modelzoo extra) and Keras's
    # preprocessing package
    _MZ + "models.nlp.bert.token_classifier.model": "keras_preprocessing",
    _MZ + "models.nlp.t5.detokenizer": "sacremoses",
    _MZ + "models.vision.fc_mnist.data": "jsonschema",
    # trainer/extensions/__init__.py imports every integration, bigcode's first, so each
    # of its modules needs bigcode_eval (and then lm_eval, and wandb for the logger).
    **{_MZ + "trainer.extensions" + sub: "bigcode_eval" for sub in (
        "", ".bigcode", ".bigcode.bigcode_eval_harness", ".eleuther",
        ".eleuther.eval_harness_utils", ".eleuther.lm_eval_harness", ".eval_harness_adapter",
        ".huggingface", ".huggingface.cache", ".wandb", ".wandb.wandb")},
}

DRIVER = r"""
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

root, packages, stand_ins = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")


class _Meta(type):
    # A stood-in class: any attribute is another stand-in, it subscripts and unions
    # (type annotations), it can be subclassed and called.
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__


class _StandIn(metaclass=_Meta):
    def __init__(self, *args, **kwargs):
        pass


def _stand_in(qualname):
    return _Meta(qualname.rsplit(".", 1)[-1], (_StandIn,), {"__qualname__": qualname})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stand_in(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # Last on sys.meta_path: an installed package is always the real one.
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in stand_ins:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_StandInFinder())

names = []
for package in packages:
    for folder, _, files in os.walk(os.path.join(root, package)):
        for file in files:
            if file.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, file), root)[:-3].replace(os.sep, ".")
                names.append(rel[: -len(".__init__")] if rel.endswith(".__init__") else rel)
names.sort()

failures = {}
for name in names:
    try:
        importlib.import_module(name)
    except BaseException as e:  # noqa: BLE001 - report every failure, SystemExit included
        failures[name] = {"type": type(e).__name__, "missing": getattr(e, "name", None),
                          "message": str(e)[:500]}
stood_in = sorted({m.split(".")[0] for m, mod in sys.modules.items()
                   if isinstance(mod, _StandInModule)})
print(json.dumps({"modules": names, "failures": failures, "stood_in": stood_in}))
"""


def test_every_modelzoo_model_and_trainer_module_imports():
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([ROOT, MODELZOO_SRC])}
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, MODELZOO_SRC, ",".join(PACKAGES), ",".join(STAND_INS)],
        env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    modules, failures = report["modules"], report["failures"]
    imported = len(modules) - len(failures)
    print(f"\nModel Zoo models + trainer: {imported} of {len(modules)} modules import; "
          f"{len(failures)} known exceptions (a package outside the test dependencies); "
          f"stood in for: {', '.join(report['stood_in']) or 'nothing'}")
    for name, why in sorted(failures.items()):
        print(f"  {name}: {why['type']}: {why['message']}")

    unexpected = {name: f"{why['type']}: {why['message']}" for name, why in failures.items()
                  if name not in KNOWN_EXCEPTIONS}
    assert not unexpected, \
        f"Model Zoo modules that do not import:\n{json.dumps(unexpected, indent=1)}"
    for name, package in KNOWN_EXCEPTIONS.items():
        assert name in modules, f"{name} is no longer a Model Zoo module; drop it from the list"
        if name in failures:
            why = failures[name]
            missing = (why["missing"] or "").split(".")[0]
            assert why["type"] == "ModuleNotFoundError" and missing == package, (
                f"{name} should fail only for want of {package}, got {why['type']}: "
                f"{why['message']}")
    assert len(modules) == 234 and len(KNOWN_EXCEPTIONS) == 14
    assert imported >= 220   # as with the real cerebras.pytorch 2.10.0
