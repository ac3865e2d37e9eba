"""Atomic file writes: a file is either its old content or its whole new content, never half.

Checkpoints, ps snapshots and their pointer files are written this way, so a process killed
(or a disk that fills) while writing leaves the previous version readable.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes | bytearray | memoryview | str
                     ) -> None:
    """Writes ``data`` to ``path`` through a temp file beside it, flushed to disk, then renamed
    over ``path``. On any failure the temp file is removed and ``path`` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-")
    try:
        with os.fdopen(fd, "w" if isinstance(data, str) else "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
