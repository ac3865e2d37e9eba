"""Makes ``cluster_helpers`` and the programs the tasks run (``programs/``) importable from every
test below this folder, subfolders included."""

import sys
from pathlib import Path

HERE = Path(__file__).parent
for _path in (HERE / "programs", HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
