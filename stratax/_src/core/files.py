"""Atomic file writes: a file is either its old content or its whole new content, never half.

Checkpoints, ps snapshots and their pointer files are written this way, so a process killed
(or a disk that fills) while writing leaves the previous version readable.

A writer killed mid-write (SIGKILL, OOM, power) cannot remove its temp file, so the temp file
is locked (``flock``) while it is written: the kernel drops the lock when the writer dies, and
``remove_stale_temporaries`` (called when a writer starts, e.g. a restarted ps) removes the
temporaries nobody holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no locks, so no clean-up of other writers' temporaries
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.tmp-"


def write_atomically(path: str | os.PathLike[str], data: bytes | bytearray | memoryview | str
                     ) -> None:
    """Writes ``data`` to ``path`` through a temp file beside it, flushed to disk, then renamed
    over ``path``. On any failure the temp file is removed and ``path`` is left as it was.

    Raises:
      OSError: the write failed (a full disk, a read-only or removed directory); the message
        names ``path`` and the temp file, and ``path`` keeps its previous content.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path))
    except OSError as err:
        raise _naming(err, path, None) from err
    try:
        if fcntl is not None:  # held until the rename: a live writer's temp is never removed
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with os.fdopen(fd, "w" if isinstance(data, str) else "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and str(path) not in str(err):
            raise _naming(err, path, tmp) from err
        raise
    finally:
        os.close(fd)


def _naming(err: OSError, path: Path, tmp: str | None) -> OSError:
    """``err`` (same class and errno) with a message naming the file being written."""
    via = f" (through {tmp})" if tmp else ""
    message = (f"Could not write {path}{via}: {err.strerror or err}; its previous version, if "
               "any, is kept. Free space on that disk or choose another directory.")
    return type(err)(err.errno, message) if err.errno is not None else type(err)(message)


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[str]:
    """Removes the temp files that ``write_atomically(path, ...)`` calls left behind when their
    process died mid-write (no process holds their lock); returns their names. A temp file a
    live writer holds is kept. Does nothing where ``flock`` is missing."""
    path = Path(path)
    removed: list[str] = []
    if fcntl is None:
        return removed
    with contextlib.suppress(FileNotFoundError):
        entries = list(os.scandir(path.parent))
        for entry in entries:
            if not entry.name.startswith(_temp_prefix(path)) or not entry.is_file(
                    follow_symlinks=False):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a live writer holds it
                os.close(fd)
                continue
            try:
                os.unlink(entry.path)
                removed.append(entry.name)
            except OSError:
                pass
            finally:
                os.close(fd)
    if removed:
        logger.warning("removed %d temp file(s) of %s left by a writer that died: %s",
                       len(removed), path, ", ".join(removed))
    return removed
