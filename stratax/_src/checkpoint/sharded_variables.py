"""The sharded variables format: a directory of versions, each variable in row-range parts.

``strategy.save_checkpoint(directory)`` (a path without ``.npz``) has every parameter server
write its shards of the variables (values, optimizer slots) as ``.npy`` files into a new
version directory (``write_part``, fsynced; the servers' side is
``parameter_server/tasks/checkpoint_methods.py``, the chief's
``parameter_server/server_checkpoints.py``); the chief then writes ``manifest.json`` (names,
shapes, row ranges, the optimizer and update counts of each part: no tensor), and commits the
version by rewriting the ``latest`` file atomically (``commit``). Until that rename, a reader
sees the previous version whole: a save killed at any point loses nothing. The versions before
the previous one are removed.

A restore gives each server, for each of its shards, the saved row ranges that cover it
(``sources``); the server reads them straight into its shard (``read_rows_into``), so no task
reads more than its own shards, and any number of servers and any partitioner restore any
saved placement. ``sx.checkpoint.load_variables`` reads the same directory into Keras
variables (whole, ``load_whole``, for a model that fits one process).

Layout::

    directory/latest             "v3": the committed version (a name only, resolved inside)
    directory/v3/manifest.json   {"format": "stratax-sharded", "version": 1, "variables": [...]}
    directory/v3/ps0/4.npy       part 4's value, written by ps 0
    directory/v3/ps0/4.m.npy     part 4's Adam slot "m"

The directory must be visible to the chief and every ps (one host, or shared storage), as the
``tf.train.Checkpoint`` of TensorFlow's parameter-server training requires.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from stratax._src.checkpoint import entries as entries_lib
from stratax._src.checkpoint.files import fsync_directory, read_latest, write_atomically

FORMAT, VERSION = "stratax-sharded", 1
LATEST, MANIFEST = "latest", "manifest.json"
VERSION_NAME = re.compile(r"v(\d+)")
PART_FILE = re.compile(r"ps\d+/\d+(\.[A-Za-z0-9_]+)?\.npy")


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a sharded checkpoint (not a ``.npz`` file)."""
    return Path(path).suffix != ".npz"


def write_part(path: Path, value: np.ndarray) -> None:
    """Writes ``value`` as a ``.npy`` file at ``path``, flushed to disk (one part's array)."""
    with open(path, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(value), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def read_rows_into(target: np.ndarray, version: Path, sources: list[list[Any]],
                   suffix: str) -> None:
    """Reads the ``sources``' rows (``[file, first row in it, rows, first row in target]``
    under ``version``, each file ``<file><suffix>.npy``) straight into ``target``: ``readinto``
    its own memory, so no buffer and no mapped file pages count in this process' memory."""
    flat = target.reshape((-1, *target.shape[1:])) if target.ndim else target.reshape(1)
    row_bytes = flat[:1].nbytes
    for file, first, rows, at in sources:
        path = version / f"{file}{suffix}.npy"
        with open(path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if major == 1
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(f)
            saved = (-1, *shape[1:]) if shape else (1,)
            if (fortran or dtype != flat.dtype or tuple(saved[1:]) != flat.shape[1:]
                    or first + rows > (shape[0] if shape else 1) or at + rows > flat.shape[0]):
                raise ValueError(f"Checkpoint part {path} holds {dtype} {shape}; rows "
                                 f"{first}..{first + rows} do not fit a shard of {flat.dtype} "
                                 f"{target.shape}.")
            f.seek(f.tell() + first * row_bytes)
            view = memoryview(flat[at:at + rows]).cast("B")
            while view:
                count = f.readinto(view)
                if not count:
                    raise ValueError(f"Checkpoint part {path} ends early: it is truncated.")
                view = view[count:]


def new_version(path: str | os.PathLike) -> tuple[Path, Path, str | None]:
    """Creates the next version directory of the sharded checkpoint ``path``; returns the
    checkpoint's root, the new version's directory and the committed version's name."""
    root = Path(path).absolute()
    root.mkdir(parents=True, exist_ok=True)
    current = _committed(root)
    number = max([int(m.group(1)) for e in root.iterdir()
                  if (m := VERSION_NAME.fullmatch(e.name))] + [0]) + 1
    version = root / f"v{number}"
    version.mkdir()
    return root, version, current


def commit(root: Path, version: Path, current: str | None,
           entries: list[dict[str, Any]]) -> None:
    """Writes the manifest of ``version`` (every part of it on disk already), makes it the
    ``latest`` and removes the versions before ``current`` (the one committed before)."""
    write_atomically(version / MANIFEST, json.dumps(
        {"format": FORMAT, "version": VERSION, "variables": entries_lib.named(entries)}))
    fsync_directory(root)
    write_atomically(root / LATEST, version.name)  # the commit
    for entry in root.iterdir():  # keep the new version and the one before it
        if VERSION_NAME.fullmatch(entry.name) and entry.name not in (version.name, current):
            shutil.rmtree(entry, ignore_errors=True)


def read_manifest(path: str | os.PathLike, version_name: str | None = None
                  ) -> tuple[Path, list[dict[str, Any]]]:
    """The committed version directory of ``path`` (or its version ``version_name``) and its
    variables' entries.

    Raises:
      ValueError: no ``latest`` file, one that names no version inside ``path``, or a
        manifest that is not this format; the message names the file and the fix.
    """
    root = Path(path).absolute()
    if version_name is not None and not VERSION_NAME.fullmatch(version_name):
        raise ValueError(f"{version_name!r} is not a version of checkpoint {str(path)!r} "
                         "(v<n>).")
    name = version_name or _committed(root)
    if name is None:
        raise ValueError(f"{str(path)!r} holds no committed sharded checkpoint (no "
                         f"{root / LATEST}); pass the directory given to "
                         "strategy.save_checkpoint, or a '.npz' file.")
    manifest = root / name / MANIFEST
    try:
        header = json.loads(manifest.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"Checkpoint manifest {manifest} cannot be read ({err}); restore "
                         "another checkpoint or write this one again.") from None
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(f"{manifest} is not a stratax sharded checkpoint (version {VERSION}); "
                         f"it says {header.get('format')!r} {header.get('version')!r}.")
    return root / name, header["variables"]


def load_whole(version: Path, entry: dict[str, Any], slot: str | None = None) -> np.ndarray:
    """The whole value (or ``slot``) of one manifest ``entry`` of the checkpoint version
    directory ``version`` (from ``read_manifest``), assembled from its parts
    (``sx.checkpoint.load_variables``)."""
    value = np.empty(entry["shape"], entry["dtype"])
    rows = entry["shape"][0] if entry["shape"] else 1
    read_rows_into(value, version, sources(entry["parts"], 0, rows), f".{slot}" if slot else "")
    return value


def _committed(root: Path) -> str | None:
    """The version ``root/latest`` names, checked to be a version directory inside ``root``.

    Raises:
      ValueError: ``latest`` holds anything but the name of an existing ``v<n>`` directory.
    """
    return read_latest(root, VERSION_NAME, MANIFEST, must_exist=True)


def sources(parts: list[dict[str, Any]], start: int, rows: int) -> list[list[Any]]:
    """The saved row ranges covering rows ``start .. start + rows``: ``[file, first row in
    the file, rows, first row in the target]``."""
    sources = []
    for part in parts:
        lo = max(start, part["start"])
        hi = min(start + rows, part["start"] + max(part["rows"], 1))
        if lo < hi:
            sources.append([part["file"], lo - part["start"], hi - lo, lo - start])
    return sources


def iterations_at(parts: list[dict[str, Any]], row: int) -> int:
    """The update count of the part holding ``row``."""
    return entries_lib.iterations_at([[p["start"], p["rows"], p["iterations"]] for p in parts],
                                    row)
