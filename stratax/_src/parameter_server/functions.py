"""How a function named on the coordinator (e.g. ``dataset_fn``) reaches a worker: by name.

No code crosses the wire. A function is sent as ``"module:qualname"``; the worker imports the
module. A function of the ``__main__`` script is sent with the script's path: a worker started
from that same script (one program for all roles) finds it in its own ``__main__``; a generic
worker (``stratax server``) loads the script file under the name ``__stratax_main__``, so its
``if __name__ == "__main__":`` block does not run, and stops the load at the script's
``ParameterServerStrategy(...)`` line. So: define ``dataset_fn`` at module level, before the
strategy is constructed, or in an importable module.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

_SCRIPT_MODULE = "__stratax_main__"
_state = threading.local()
_lock = threading.Lock()


class DefinitionsLoaded(BaseException):
    """Raised by ``ParameterServerStrategy(...)`` while a worker loads a script for its
    definitions: it ends the load there (BaseException so user ``except Exception`` cannot
    swallow it)."""


def loading_definitions() -> bool:
    """True while a worker executes a script only to find functions in it."""
    return bool(getattr(_state, "loading", False))


def reference(fn: Callable[..., Any]) -> dict[str, Any]:
    """``{"name": "module:qualname", "script": path-or-None}`` for a module-level function.

    Raises:
      ValueError: ``fn`` is a lambda, a nested function, or has no module.
    """
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if not module or not qualname or "<" in qualname:
        raise ValueError(
            f"{fn!r} cannot be sent to workers: they receive functions by name, not as code. "
            "Define it with `def` at the top level of your script (before the strategy is "
            "created) or of an importable module."
        )
    script = None
    if module == "__main__":
        main = sys.modules.get("__main__")
        path = getattr(main, "__file__", None)
        if not path:
            raise ValueError(f"{fn!r} is defined in an interactive __main__; workers cannot "
                             "load it. Put it in a module or a script file.")
        script = os.path.abspath(path)
    return {"name": f"{module}:{qualname}", "script": script}


def resolve(ref: dict[str, Any]) -> Callable[..., Any]:
    """The function named by ``reference`` output, imported (or loaded from its script)."""
    name, script = ref.get("name"), ref.get("script")
    if not isinstance(name, str) or name.count(":") != 1:
        raise ValueError(f"Function reference {name!r} must be 'module:qualname'.")
    module_name, qualname = name.split(":")
    if module_name == "__main__":
        if not isinstance(script, str):
            raise ValueError(f"{name!r} needs the path of its script.")
        module = _script_module(script, qualname)
    else:
        module = importlib.import_module(module_name)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(
                f"{name!r} is not defined when the worker loads {script or module_name!r}; "
                "define it at the top level, before the strategy is created."
            )
    if not callable(target):
        raise TypeError(f"{name!r} is not callable.")
    return target


def _script_module(script: str, qualname: str) -> Any:
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main_file and os.path.abspath(main_file) == script and hasattr(main, qualname.split(".")[0]):
        return main
    with _lock:
        loaded = sys.modules.get(_SCRIPT_MODULE)
        if loaded is not None and getattr(loaded, "__file__", None) == script:
            return loaded
        spec = importlib.util.spec_from_file_location(_SCRIPT_MODULE, script)
        if spec is None or spec.loader is None:
            raise ValueError(f"Cannot load script {script!r} on this worker; the workers need "
                             "the same files at the same paths as the chief.")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_SCRIPT_MODULE] = module
        _state.loading = True
        try:
            spec.loader.exec_module(module)
        except DefinitionsLoaded:
            pass
        finally:
            _state.loading = False
        return module
