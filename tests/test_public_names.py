"""stratax's public names: each one in ``__all__`` imports, and editors and type checkers see
each one (the ``TYPE_CHECKING`` block of ``stratax/__init__.py``, read as a type checker reads
it, and the ``py.typed`` marker)."""

import ast
import importlib
import types
from pathlib import Path

import stratax as sx

INIT = Path(sx.__file__)


def _type_checking_imports() -> dict[str, str]:
    """Name -> module of every import in the ``if TYPE_CHECKING:`` block (a submodule of
    stratax as its own module), checking that each is an explicit re-export (``X as X``)."""
    tree = ast.parse(INIT.read_text())
    (block,) = [node for node in tree.body if isinstance(node, ast.If)
                and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"]
    seen: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            assert alias.asname == alias.name, f"{alias.name}: re-export it as `X as X`"
            assert alias.name not in seen, f"{alias.name} is imported twice"
            module = node.module
            seen[alias.name] = f"stratax.{alias.name}" if module == "stratax" else module
    return seen


def test_type_checkers_see_every_public_name_from_its_module():
    seen = _type_checking_imports()
    assert sorted(seen) == sx.__all__
    assert seen == sx._EXPORTS  # the same module as the lazy import
    assert (INIT.parent / "py.typed").is_file()


def test_every_public_name_imports_and_is_listed_by_dir():
    for name in sx.__all__:
        value = getattr(sx, name)
        module = sx._EXPORTS[name]
        if module == f"stratax.{name}":
            assert isinstance(value, types.ModuleType) and value.__name__ == module
        else:
            assert value is getattr(importlib.import_module(module), name)
    assert set(sx.__all__) <= set(dir(sx))
    namespace: dict[str, object] = {}
    exec("from stratax import *", namespace)
    assert set(sx.__all__) <= set(namespace)
