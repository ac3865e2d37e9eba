"""The launcher path imports neither JAX nor Keras (a launcher process only starts workers)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

CHECK = (
    "import sys\n"
    "{prelude}"
    "import stratax._src.launch, stratax._src.cli, stratax.__main__\n"
    "stratax._src.cli.build_parser().parse_args(['launch', '--nproc-per-node', '2', 'x.py'])\n"
    "loaded = sorted(m for m in ('jax', 'jaxlib', 'keras') if m in sys.modules)\n"
    "assert not loaded, loaded\n"
)
# Stands in for stratax/__init__.py, so the check covers the launcher's own modules only.
STUB_PACKAGE = (
    "import types; pkg = types.ModuleType('stratax'); pkg.__path__ = [{path!r}]; "
    "sys.modules['stratax'] = pkg\n"
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.timeout(90)
def test_launcher_modules_import_neither_jax_nor_keras():
    done = _run(CHECK.format(prelude=STUB_PACKAGE.format(path=str(REPO_ROOT / "stratax"))))
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(90)
def test_importing_the_launcher_through_the_package_imports_neither_jax_nor_keras():
    done = _run(CHECK.format(prelude=""))
    assert done.returncode == 0, done.stderr
