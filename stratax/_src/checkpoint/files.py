"""Atomic file writes: a file is either its old content or its whole new content, never half.

Checkpoints, ps snapshots and their pointer files are written this way, so a process killed
(or a disk that fills) while writing leaves the previous version readable: single files
(``write_atomically``; ``write_npz`` for arrays with a JSON header), files another library
writes (``atomic_target``, for ``model.save``), and directories (``hold_directory``).

A writer killed mid-write (SIGKILL, OOM, power) cannot remove its temp file, so the temp file
is locked (``flock``) while it is written: the kernel drops the lock when the writer dies, and
``remove_stale_temporaries`` (called when a writer starts, e.g. a restarted ps) removes the
temporaries nobody holds.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

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
    over ``path`` and the directory flushed. On any failure the temp file is removed and
    ``path`` is left as it was.

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
        lock_held(fd)  # until the rename: a live writer's temp file is never removed
        with os.fdopen(fd, "w" if isinstance(data, str) else "wb", closefd=False) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)  # the rename itself survives a crash
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError) and str(path) not in str(err):
            raise _naming(err, path, tmp) from err
        raise
    finally:
        os.close(fd)


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """Flushes ``path``'s directory entries (files created or renamed in it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _naming(err: OSError, path: Path, tmp: str | None) -> OSError:
    """``err`` (same class and errno) with a message naming the file being written."""
    via = f" (through {tmp})" if tmp else ""
    message = (f"Could not write {path}{via}: {err.strerror or err}; its previous version, if "
               "any, is kept. Free space on that disk or choose another directory.")
    return type(err)(err.errno, message) if err.errno is not None else type(err)(message)


def lock_held(fd: int) -> None:
    """Takes ``fd``'s exclusive lock (a temp file or directory being written): until ``fd`` is
    closed, or its process dies, ``remove_stale`` leaves the entry alone."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def hold_directory(path: str | os.PathLike[str]) -> int | None:
    """Opens and locks a temp directory being written (see ``lock_held``); close the returned
    descriptor when done (None where ``flock`` is missing)."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        lock_held(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_stale(directory: str | os.PathLike[str], prefix: str) -> list[str]:
    """Removes the entries of ``directory`` named ``prefix*`` (temp files or directories) that
    no process holds locked (their writer died mid-write); returns their names. Does nothing
    where ``flock`` is missing."""
    removed: list[str] = []
    if fcntl is None:
        return removed
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(prefix)]
    except FileNotFoundError:
        return removed
    for entry in entries:
        is_dir = entry.is_dir(follow_symlinks=False)
        if not is_dir and not entry.is_file(follow_symlinks=False):
            continue
        flags = os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if is_dir else 0)
        try:
            fd = os.open(entry.path, flags)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer holds it
            os.close(fd)
            continue
        try:
            if is_dir:
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:
            pass
        finally:
            os.close(fd)
    if removed:
        logger.warning("removed %d temporary entr%s in %s left by a writer that died: %s",
                       len(removed), "y" if len(removed) == 1 else "ies", directory,
                       ", ".join(removed))
    return removed


def remove_stale_temporaries(path: str | os.PathLike[str]) -> list[str]:
    """Removes the temp files that ``write_atomically(path, ...)`` calls left behind when their
    process died mid-write (no process holds their lock); returns their names. A temp file a
    live writer holds is kept."""
    path = Path(path)
    return remove_stale(path.parent, _temp_prefix(path))


HEADER = "header"  # the npz member holding the JSON header, as uint8 bytes


def write_npz(path: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Writes ``arrays`` and the JSON ``header`` to ``path`` atomically (an interrupted write
    leaves the old file)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, **{HEADER: np.frombuffer(json.dumps(header).encode(), np.uint8)})
    write_atomically(path, buffer.getbuffer())


@contextmanager
def atomic_target(path: str | os.PathLike[str], write: bool) -> Iterator[str]:
    """A temporary file name beside ``path`` (same suffixes) that replaces ``path`` on success.

    With ``write=False`` (a non-chief worker) the name points into a private temporary directory
    that is removed afterwards, so the real path is never touched.
    """
    target = Path(path)
    suffix = "".join(target.suffixes) or ""
    if not write:
        scratch = tempfile.mkdtemp(prefix="stratax-nonchief-")
        try:
            yield str(Path(scratch) / f"discard{suffix}")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-", suffix=suffix)
    os.close(fd)
    os.unlink(tmp)
    try:
        yield tmp
        if Path(tmp).is_dir() and target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if Path(tmp).is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            Path(tmp).unlink(missing_ok=True)


def read_latest(root: Path, version_name: re.Pattern[str], marker: str,
                must_exist: bool = False) -> str | None:
    """The version name ``root/latest`` holds (``None`` without that file): a checkpoint
    directory's commit pointer, read so that it can only name a version inside ``root``.

    Args:
      version_name: the versions' names, the number in its first group (``ckpt-(\\d+)``).
      marker: the file a complete version holds (named in the error).
      must_exist: the named version must also be a directory.

    Raises:
      ValueError: ``latest`` holds anything else (a path elsewhere, a corrupt name); the
        message names the file, the newest complete version and the fix.
    """
    latest = root / "latest"
    try:
        name = latest.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None
    if version_name.fullmatch(name) and (not must_exist or (root / name).is_dir()):
        return name
    complete = sorted((int(m.group(1)), entry.name) for entry in root.iterdir()
                      if (m := version_name.fullmatch(entry.name)) and (entry / marker).exists())
    form = version_name.pattern.replace(r"(\d+)", "<n>")
    raise ValueError(
        f"{latest} holds {name[:80]!r}, not the name of a checkpoint version in {root} "
        f"({form}): the file is corrupt. Write the name of the newest complete version there "
        f"({complete[-1][1] if complete else 'none'}), or remove the directory to start "
        "afresh.")
