"""The cluster layer is pure configuration: importing and using it never imports JAX or Keras."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CLUSTER_FILES = [
    *sorted((REPO / "stratax" / "_src" / "cluster").glob("*.py")),
    REPO / "stratax" / "cluster_resolver.py",
]
FORBIDDEN = ("jax", "jaxlib", "keras")

# Runs in a fresh interpreter. `stratax` and `stratax._src` are replaced by bare package stubs so
# that only the cluster layer and what it imports are loaded (stratax/__init__.py imports the
# whole library, JAX included); the cluster modules and their `stratax._src.core` imports are real.
_PROBE = r"""
import importlib, json, sys, types
root = sys.argv[1]
for name, path in (("stratax", root + "/stratax"), ("stratax._src", root + "/stratax/_src")):
    stub = types.ModuleType(name)
    stub.__path__ = [path]
    sys.modules[name] = stub
cluster = importlib.import_module("stratax._src.cluster")
importlib.import_module("stratax.cluster_resolver")
cluster.process_layout(cluster.detect_cluster_resolver())
loaded = sorted({m.split(".")[0] for m in sys.modules})
print(json.dumps({"loaded": loaded, "cluster_file": cluster.__file__}))
"""


@pytest.mark.timeout(60)
def test_importing_the_cluster_layer_does_not_import_jax_or_keras() -> None:
    environ = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, str(REPO)],
        capture_output=True, text=True, timeout=50, cwd=REPO, env=environ,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["cluster_file"].startswith(str(REPO / "stratax" / "_src" / "cluster"))
    assert "stratax" in report["loaded"]
    assert [name for name in FORBIDDEN if name in report["loaded"]] == []


def _imported_modules(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_cluster_modules_import_only_stdlib_core_and_cluster(path: pathlib.Path) -> None:
    allowed_prefixes = ("stratax._src.core", "stratax._src.cluster")
    bad = [
        name for name in _imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name != "__future__"
        and not name.startswith(allowed_prefixes)
    ]
    assert bad == [], f"{path.name} imports {bad}; the cluster layer may import only the " \
                      "standard library, stratax._src.core and stratax._src.cluster."
