#!/usr/bin/env bash
# Install the project into ./.venv. `scripts/install.sh test` adds the test dependencies and
# the `modelzoo` extra (what Cerebras Model Zoo's trainer needs; tests/modelzoo runs it).
# torch is pinned to the CPU build first, so that no dependency can pull a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
if [ "${1:-}" = "test" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[test,modelzoo]"
else
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
fi
.venv/bin/python -c "import torch; assert not torch.version.cuda, 'a CUDA build of torch was installed'"
# pip writes the bytecode of what it installs into site-packages, but an editable install
# leaves this project's own modules to be compiled at their first import, and compiled again
# at every import where PYTHONDONTWRITEBYTECODE is set: written once here instead.
.venv/bin/python -m compileall -q cstorch bridge wafer cerebras cstorch_torchvision.py > /dev/null
