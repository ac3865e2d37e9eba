"""The benchmarks measure what a user's program sees: only ``benchmarks/internals/`` (stratax's
components, timed below the public API on purpose) may import ``stratax._src``."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
INTERNALS = BENCHMARKS / "internals"


def _private_imports(path: Path, root: Path = BENCHMARKS) -> list[str]:
    """``stratax._src`` imports of ``path`` (``import``, ``from ... import``, and the module
    names a program passes to ``python -m``), as ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value] if node.value.startswith("stratax._src") else []
        for name in names:
            if name == "stratax._src" or name.startswith("stratax._src."):
                found.append(f"{path.relative_to(root)}:{node.lineno} {name}")
                break
    return found


def test_only_the_internals_import_stratax_private_modules():
    programs = [p for p in BENCHMARKS.rglob("*.py") if ".venvs" not in p.parts
                and ".cache" not in p.parts and p != Path(__file__).resolve()]
    assert len(programs) > 40  # the scan sees the benchmarks
    private = [hit for p in programs if INTERNALS not in p.parents
               for hit in _private_imports(p)]
    assert not private, ("benchmarks outside benchmarks/internals/ import stratax's private "
                         f"modules; use `import stratax as sx` and its public names: {private}")


def test_the_scan_finds_every_form_of_private_import(tmp_path):
    """The check above can fail: each form of a private import is caught."""
    program = tmp_path / "program.py"
    program.write_text("import stratax._src.core\nfrom stratax._src import seam\n"
                       "from stratax import _src\n"
                       "command = ['python', '-m', 'stratax._src.launch']\nimport stratax\n")
    hits = [hit.split(" ", 1)[1] for hit in _private_imports(program, tmp_path)]
    assert hits == ["stratax._src.core", "stratax._src", "stratax._src",
                    "stratax._src.launch"], hits
