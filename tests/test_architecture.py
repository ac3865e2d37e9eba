"""The package's shape: no import cycles, imports one way through the layers, a light start.

ARCHITECTURE.md (in the repository root) lists the layers, and this test reads them from it; a
module imports only from its own layer and the ones before it. Function-local imports count: a
cycle dodged by one is still a cycle.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "stratax"


def _layers_from_architecture_md() -> dict[str, int]:
    """The layer of each part of stratax/_src, read from ARCHITECTURE.md's numbered list (one
    source for the document and this test): ``N. `part`, `part`: what they hold``."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    listing = text.split("<!-- layers:", 1)[1].split("\n\n", 1)[0]
    layers = {}
    for number, names in re.findall(r"^(\d+)\. ((?:`[a-z_]+`(?:, )?)+)", listing, re.M):
        for name in re.findall(r"`([a-z_]+)`", names):
            layers[name] = int(number)
    return layers


LAYERS = _layers_from_architecture_md()
PUBLIC_LAYER = max(LAYERS.values()) + 1  # the public re-export modules
# Modules whose layer is not their package's: observe's pure writers import only the standard
# library and core (see stratax/_src/observe/__init__.py), so any layer may report through them
# (the parameter-server coordinator writes its workers' records with them).
MODULE_LAYERS = {"stratax._src.observe.run_dir": 0, "stratax._src.observe.record": 0}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                # ``from package import submodule`` depends on the submodule; ``from module import
                # name`` on the module.
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("stratax"):
                    found.add(target)
        graph[name] = found
    return graph


def _layer(module: str) -> int:
    if module in MODULE_LAYERS:
        return MODULE_LAYERS[module]
    parts = module.split(".")
    if parts[:2] != ["stratax", "_src"] or len(parts) < 3:
        return PUBLIC_LAYER
    return LAYERS[parts[2]]


def test_architecture_md_names_every_part_of_the_package():
    parts = {p.name for p in (PACKAGE / "_src").iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    parts = {p.removesuffix(".py") for p in parts} - {"__init__"}
    assert parts == set(LAYERS), (sorted(parts - set(LAYERS)), sorted(set(LAYERS) - parts))


def test_no_module_imports_one_that_imports_it_back():
    graph = _imports()
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_imports_go_one_way_through_the_layers():
    graph = _imports()
    upward = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
              for a, targets in graph.items() for b in targets
              if _layer(b) > _layer(a) and _layer(b) != PUBLIC_LAYER]
    # Internals never import the public re-export modules (stratax, stratax.launch...).
    upward += [f"{a} imports the public module {b}" for a, targets in graph.items()
               for b in targets if a.startswith("stratax._src") and _layer(b) == PUBLIC_LAYER]
    assert not upward, "\n".join(sorted(upward))


def test_lower_layers_do_not_import_keras():
    offenders = []
    for path in (PACKAGE / "_src").rglob("*.py"):
        name = _module_name(path)
        if _layer(name) >= LAYERS["keras"] or name == "stratax._src.seam":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{name} imports {n}" for n in names if n.split(".")[0] == "keras"]
    assert not offenders, offenders


@pytest.mark.parametrize("statement", [
    "import stratax",
    "import stratax.launch",
    "import stratax.cluster_resolver",
    "from stratax._src import cli; cli.build_parser()",
])
def test_start_up_paths_import_neither_jax_nor_keras(statement):
    code = (f"import sys; {statement}; "
            "heavy = [m for m in ('jax', 'keras', 'jaxlib') if m in sys.modules]; "
            "assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


TESTS = ROOT / "tests"


def test_the_tests_mirror_the_package():
    """Every folder of ``stratax/_src`` that is a package has a test folder of the same path
    holding tests, and no test file repeats its folder's name (``tests/parameter_server/
    test_ps_cluster.py``) unless it tests the module of that name (``cluster/cluster_spec.py``):
    a newcomer finds a module's tests where the module sits."""
    source = PACKAGE / "_src"
    packages = sorted(p.parent.relative_to(source) for p in source.rglob("__init__.py")
                      if p.parent != source)
    untested = [str(p) for p in packages if not list((TESTS / p).glob("test_*.py"))]
    assert not untested, f"package folders without tests/<same path>/test_*.py: {untested}"
    redundant = []
    for test in TESTS.rglob("test_*.py"):
        folder = test.parent.name
        initials = "".join(word[0] for word in folder.split("_"))
        prefixes = {f"test_{folder}_"} | ({f"test_{initials}_"} if "_" in folder else set())
        module = PACKAGE / "_src" / test.parent.relative_to(TESTS) / f"{test.stem[5:]}.py"
        if any(test.name.startswith(p) for p in prefixes) and not module.exists():
            redundant.append(str(test.relative_to(TESTS)))
    assert not redundant, f"test files that repeat their folder's name: {redundant}"


# The one module that touches Keras' and JAX's internals, kept whole on purpose: its list of
# what it patches and why reads as one page (see its docstring).
WHOLE_ON_PURPOSE = {"stratax/_src/seam.py"}


def test_every_module_stays_under_400_lines():
    """A module has one job; past 400 lines it has usually grown a second (split it along the
    jobs, as ARCHITECTURE.md's table of modules shows)."""
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert set(long) == WHOLE_ON_PURPOSE, f"modules over 400 lines: {long}"
