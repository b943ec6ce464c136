"""ruff, with the rules of pyproject.toml (pycodestyle, pyflakes, bugbear, pyupgrade and
imports inside functions), is clean on the whole repository."""
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable)) or shutil.which("ruff")
    assert ruff is not None, "ruff is part of the test dependencies (pip install -e .[test])"
    result = subprocess.run([ruff, "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:]
