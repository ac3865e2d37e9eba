#!/usr/bin/env bash
# The other end of the tested range (pyproject.toml, stratax/_src/seam.py): the Keras- and
# JAX-facing tests on Python 3.12 with the newest JAX that installs there and the oldest Keras
# stratax claims. Run from the repository root; the venv is kept in .venv-range/ between runs.
set -euo pipefail
tools=$PWD/.python-range   # a Python 3.12 this script installed (uv's), when none was here
find_python312() {
  local candidate
  for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 \
      "$tools"/python/cpython-3.12*/bin/python3.12; do
    if "$candidate" -c "import sys; assert sys.version_info[:2] == (3, 12)" 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if ! python312=$(find_python312); then
  # No Python 3.12: install one with uv (from PyPI, into $tools), or fail. Skipping would
  # report the range as tested when it was not.
  echo "other end of the range: no python3.12 here; installing one with uv into $tools"
  python -m pip install -q --target "$tools/uv" uv
  if ! UV_PYTHON_INSTALL_DIR="$tools/python" "$tools/uv/bin/uv" python install 3.12 \
      || ! python312=$(find_python312); then
    echo "other end of the range: FAILED, could not install Python 3.12 (uv python install" \
         "downloads it from github.com); install python3.12 and rerun" >&2
    exit 1
  fi
fi
venv=.venv-range
[ -x "$venv/bin/python" ] || "$python312" -m venv "$venv"
# The project's own dependencies (the newest JAX pyproject allows), Keras held at the oldest.
# grain: fit on a grain dataset with a Keras older than its grain adapter (tests/keras). The
# TensorFlow the test extra installs needs a newer Keras; its tests run in the main suite.
"$venv/bin/python" -m pip install -q -e . "keras==3.10.0" "pytest>=8" "pytest-timeout>=2.3" grain
KERAS_BACKEND=jax "$venv/bin/python" -c "import jax, keras; print('other end of the range: jax', \
jax.__version__, 'keras', keras.__version__)"
# One multi-process fit too: Keras 3.10 once refused stratax's input under a distribution over
# several processes.
# test_failed_calls compares with plain Keras 3.15's failure behaviour; Keras 3.10 fails differently.
# test_add_loss compares with plain Keras, whose Layer._clear_losses before 3.14 removes a
# collected loss by value (list.remove), not by identity: evaluate's loss of a model with added
# losses then varies from run to run, plain Keras' as much as stratax's.
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/keras tests/strategies/test_run.py \
  --ignore tests/keras/test_failed_calls.py --ignore tests/keras/test_add_loss.py \
  tests/multiprocess/test_shm_collectives.py::test_fit_over_shm_equals_one_process
