"""`cerebras` is a namespace shared with other distributions: `cerebras.pytorch` (this
project) and `cerebras.modelzoo` (Model Zoo, on another path) import in one process, in
either order, from the editable install and from a wheel."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from tests.conftest import ROOT, SHARED

MODELZOO_SRC = os.path.join(SHARED, "modelzoo", "src")

# Prints where each package came from, so a test can tell which install it exercised.
PROBE = """
import json, sys
{imports}
import cerebras, cstorch
import cerebras.appliance.storage, cerebras.modelzoo
print(json.dumps({{
    "alias": sys.modules["cerebras.pytorch"] is cstorch,
    "optim": sys.modules["cerebras.pytorch.optim"] is cstorch.optim,
    "cerebras_path": list(cerebras.__path__),
    "cstorch": cstorch.__file__,
    "appliance": cerebras.appliance.__file__,
    "modelzoo": list(cerebras.modelzoo.__path__),
}}))
"""
# The wheel is checked without importing torch and jax (most of a probe's time): the
# namespace is assembled the same way for every subpackage, and `find_spec` locates
# `cerebras.pytorch` without running it.
LIGHT_PROBE = """
import importlib.util, json
{imports}
import cerebras, cerebras.appliance
print(json.dumps({{
    "cerebras_path": list(cerebras.__path__),
    "appliance": cerebras.appliance.__file__,
    "pytorch": importlib.util.find_spec("cerebras.pytorch").origin,
    "cstorch": importlib.util.find_spec("cstorch").origin,
}}))
"""
LIGHT_ORDERS = {
    "appliance_first": "import cerebras.appliance.storage\nimport cerebras.modelzoo",
    "modelzoo_first": "import cerebras.modelzoo\nimport cerebras.appliance.storage",
}
ORDERS = {
    "pytorch_first": "import cerebras.pytorch as cstorch_alias\nimport cerebras.modelzoo",
    "modelzoo_first": "import cerebras.modelzoo\nimport cerebras.pytorch as cstorch_alias",
}


def _probe_orders(pythonpath, cwd, extra_args=(), probe=PROBE, orders=ORDERS):
    """Run PROBE once per import order, the processes side by side (each imports torch
    and jax, which is most of its time); return {order: what it printed}."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.setdefault("JAX_PLATFORMS", "cpu")
    procs = {order: subprocess.Popen(
                 [sys.executable, *extra_args, "-c", probe.format(imports=imports)],
                 cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for order, imports in orders.items()}
    results = {}
    for order, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{order}: {stderr[-3000:]}"
        results[order] = json.loads(stdout.strip().splitlines()[-1])
    return results


@pytest.fixture(scope="module")
def modelzoo_src():
    assert os.path.isdir(os.path.join(MODELZOO_SRC, "cerebras", "modelzoo")), \
        f"Model Zoo's source must be at {MODELZOO_SRC}"
    return MODELZOO_SRC


def test_no_regular_package_claims_the_namespace():
    assert not os.path.exists(os.path.join(ROOT, "cerebras", "__init__.py"))


def test_installed_project_and_modelzoo_share_the_namespace(modelzoo_src, tmp_path):
    # Run outside the checkout so that only the install (editable in .venv) provides cerebras.pytorch.
    for order, out in _probe_orders([modelzoo_src], cwd=tmp_path).items():
        assert out["alias"] and out["optim"], order
        assert out["cstorch"].startswith(os.path.join(ROOT, "cstorch")), order
        assert out["appliance"].startswith(os.path.join(ROOT, "cerebras", "appliance")), order
        assert out["modelzoo"] == [os.path.join(modelzoo_src, "cerebras", "modelzoo")], order


def test_wheel_ships_a_namespace_and_imports_beside_modelzoo(modelzoo_src, tmp_path):
    # The wheel is built offline with the environment's setuptools (pyproject's build requirement).
    pytest.importorskip("setuptools", minversion="68")
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    for name in ("cerebras", "cstorch", "bridge", "wafer"):
        shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
    (src / "cerebras_logs").mkdir()  # run artifacts beside the code must not be packaged
    (src / "cerebras_logs" / "x.py").write_text("")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-q", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "cerebras/__init__.py" not in names
    assert "cerebras/pytorch/__init__.py" in names
    assert "cerebras/appliance/storage/h5_storage.py" in names
    assert "cstorch/__init__.py" in names and "bridge/__init__.py" in names
    assert not [n for n in names if n.startswith(("cerebras_logs", "tests/")) or "__pycache__" in n]

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                    "--disable-pip-version-check", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    # -S skips site-packages' .pth files, which hold the editable install's import hook;
    # the environment's site-packages still provides torch and jax through PYTHONPATH.
    site = sysconfig.get_paths()["purelib"]
    results = _probe_orders([modelzoo_src, str(target), site], cwd=tmp_path, extra_args=("-S",),
                            probe=LIGHT_PROBE, orders=LIGHT_ORDERS)
    for order, out in results.items():
        assert out["appliance"].startswith(str(target)), order
        assert out["pytorch"].startswith(str(target)), order
        assert out["cstorch"].startswith(str(target)), order
        assert sorted(out["cerebras_path"]) == sorted(
            [os.path.join(modelzoo_src, "cerebras"), str(target / "cerebras")]), order


def test_alias_submodules_are_cstorch_modules():
    import cerebras.pytorch as alias
    import cerebras.pytorch.optim
    import cerebras.pytorch.storage
    import cstorch
    from cerebras.pytorch.utils.data import DataExecutor

    assert alias is cstorch
    assert sys.modules["cerebras.pytorch.optim"] is cstorch.optim
    assert cerebras.pytorch.optim.SGD is cstorch.optim.SGD
    assert sys.modules["cerebras.pytorch.storage"] is sys.modules["cstorch.storage"]
    assert DataExecutor is cstorch.utils.data.DataExecutor
