"""The benchmarks measure what a user's program sees: none of them, nor their tests, imports
``stratax._src`` (they use ``import stratax as sx``, its documented options and its CLI)."""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]


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


def _private_attributes(path: Path, root: Path = BENCHMARKS) -> list[str]:
    """Private attributes ``path`` reads or sets on objects not its own (``obj._name``, other
    than on ``self``/``cls``, a benchmarks module it imported, and ``os._exit``), as
    ``file:line obj._name``: a stratax object's private state is no public API either."""
    tree = ast.parse(path.read_text(), str(path))
    own = {"self", "cls"}
    for node in ast.walk(tree):  # the benchmarks' own modules: their tests may reach inside
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
            own.update(alias.asname or alias.name for alias in node.names)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            owner = ast.unparse(node.value)
            if owner not in own and f"{owner}.{node.attr}" != "os._exit":
                found.append(f"{path.relative_to(root)}:{node.lineno} {owner}.{node.attr}")
    return found


def _programs() -> list[Path]:
    return [p for p in BENCHMARKS.rglob("*.py") if ".venvs" not in p.parts
            and ".cache" not in p.parts and p != Path(__file__).resolve()]


def test_no_benchmark_reads_private_attributes():
    private = [hit for p in _programs() for hit in _private_attributes(p)]
    assert not private, ("benchmarks reach into private attributes; measure through public "
                         f"behaviour (callbacks, options, documented methods): {private}")


def test_the_scan_finds_private_attributes(tmp_path):
    program = tmp_path / "program.py"
    program.write_text("from benchmarks.workloads import ps\ncallback._warm = True\n"
                       "strategy._ps.clients\nself._x = 1\nos._exit(0)\nobj.__class__\n"
                       "ps._apply_seconds\n")
    hits = [hit.split(" ", 1)[1] for hit in _private_attributes(program, tmp_path)]
    assert sorted(hits) == ["callback._warm", "strategy._ps"], hits


def test_no_benchmark_imports_stratax_private_modules():
    programs = _programs()
    assert len(programs) > 40  # the scan sees the benchmarks
    assert any("tests" in p.parts for p in programs)  # and their tests
    private = [hit for p in programs for hit in _private_imports(p)]
    assert not private, ("benchmarks import stratax's private modules; use `import stratax as "
                         f"sx` and its public names: {private}")


def test_the_scan_finds_every_form_of_private_import(tmp_path):
    """The check above can fail: each form of a private import is caught."""
    program = tmp_path / "program.py"
    program.write_text("import stratax._src.core\nfrom stratax._src import seam\n"
                       "from stratax import _src\n"
                       "command = ['python', '-m', 'stratax._src.launch']\nimport stratax\n")
    hits = [hit.split(" ", 1)[1] for hit in _private_imports(program, tmp_path)]
    assert hits == ["stratax._src.core", "stratax._src", "stratax._src",
                    "stratax._src.launch"], hits
