"""Python processes the test suite starts load neither matplotlib nor IPython.

Keras imports both at start-up whenever they are installed (for its plotting and notebook
helpers): about 1 s of a worker's 3 s start on a 2-core box, and the suite starts many
workers. No program the tests start plots or opens a shell, and Keras works without
them, so ``tests/conftest.py`` puts this directory first on the children's ``PYTHONPATH``. A
child that needs them (the benchmark harness's own checks) is started with
``STRATAX_TEST_CHILD_PLOTS=1``. A ``sitecustomize`` further down the path still runs.
"""

import importlib.machinery
import importlib.util
import os
import sys

if os.environ.get("STRATAX_TEST_CHILD_PLOTS") != "1":
    for _name in ("matplotlib", "IPython"):
        sys.modules.setdefault(_name, None)  # "import matplotlib" raises ImportError

_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_next = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
