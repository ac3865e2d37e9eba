"""Versioned state checkpoints: a failed or interrupted save never damages the previous one.

The format of training state backups (``sx.BackupAndRestore``, ``PreemptionCheckpointHandler``,
under every strategy but the parameter servers'). A checkpoint directory holds numbered
versions (``ckpt-<n>/``, each complete and flushed to disk, files and directory, before it
becomes visible) and a ``latest`` file naming the newest, resolved only to a ``ckpt-<n>``
inside the directory (anything else is an error). A version is written in a ``.staging-*``
directory locked (``flock``) by its writer; one whose writer died mid-save (SIGKILL) is
removed by the next save. A save writes the new version under a
temporary name, renames it into place, then replaces ``latest`` with ``os.replace`` (atomic on
POSIX), and only then removes older versions. Arrays go into ``state.npz`` (numpy, no pickle),
each under its name (``np.load(".../state.npz")["model/sequential/dense/kernel"]``); metadata
into ``meta.json``. Versions written before names existed hold ``arr_0``, ``arr_1``, ... in
order.

State sharded over processes (``save_sharded``): every process writes its own shards into one
staging directory, and process 0 commits the version as above once all of them are on disk
(``sharded_state``); its ``meta.json`` lists those entries, which ``load`` returns as readers
that restore into any process count and layout.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from stratax._src import seam
from stratax._src.checkpoint import sharded_state
from stratax._src.checkpoint.files import (
    fsync_directory,
    hold_directory,
    read_latest,
    remove_stale,
    remove_stale_temporaries,
    write_atomically,
)

_LATEST = "latest"
_VERSION = re.compile(r"ckpt-(\d+)")  # the only names ``latest`` may hold


def save(directory: str | os.PathLike[str], arrays: Mapping[str, np.ndarray],
         meta: dict[str, Any]) -> Path:
    """Writes a new checkpoint version (``arrays`` by name) and makes it the latest; returns its
    directory."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale(root, ".staging-")   # of a writer killed mid-save
    return _commit(root, arrays, meta)


def save_sharded(directory: str | os.PathLike[str], arrays: Mapping[str, np.ndarray],
                 parts: Mapping[str, sharded_state.Parts], meta: dict[str, Any],
                 order: list[str], tag: str | None = None) -> Path | None:
    """Writes a new checkpoint version whose ``parts`` are arrays sharded over processes:
    called by every process (at the same point of the run), each with its own pieces; process
    0 gives ``arrays`` (the whole ones, by name) and ``meta``, waits for every process's
    pieces, commits the version and returns its directory (the others return ``None`` once it
    is committed). ``order`` lists every entry name in the order ``load`` returns them;
    ``tag`` names the save (``sharded_state.next_tag()``, taken now by default)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tag = sharded_state.next_tag() if tag is None else tag
    staging, held = sharded_state.stage(root, parts, tag)
    try:
        if jax.process_index() != 0:
            sharded_state.wait_for_commit(tag, root)
            return None
        try:
            sharded_state.wait_for_peers(tag, root)
            meta = {**meta, "processes": jax.process_count(), "order": order,
                    "sharded": {name: {"shape": list(part.shape), "dtype": part.dtype}
                                for name, part in parts.items()}}
            final = _commit(root, arrays, meta, staging)
            remove_stale(root, ".staging-")   # of a job killed mid-save
        except BaseException as err:
            shutil.rmtree(staging, ignore_errors=True)
            sharded_state.announce(tag, f"{type(err).__name__}: {err}")
            raise
        sharded_state.announce(tag, "ok")
        return final
    finally:
        if held is not None:
            os.close(held)


def held_in_parts(variables: Mapping[str, Any]) -> set[str]:
    """The names in ``variables`` whose values no process holds whole (split over several
    processes' devices): each process writes its own shards of them."""
    return {name for name, v in variables.items()
            if sharded_state.is_sharded(seam.held_value(v))}


def writes_whole(is_chief: bool, sharded: Collection[str]) -> bool:
    """Whether this process writes the whole arrays and the metadata of a save: the chief, or
    process 0 (which commits) when some state is held in parts."""
    return jax.process_index() == 0 if sharded else is_chief


def prepare_save(directory: str | os.PathLike[str], variables: Mapping[str, Any],
                 meta: Callable[[], dict[str, Any]], sharded: Collection[str],
                 is_chief: bool) -> Callable[[], Path | None] | None:
    """Copies to host memory what this process writes of ``variables`` (by entry name) and
    returns the write, to run now or in a background thread (the copy is taken now: the next
    step may donate the variables' buffers); ``None`` when this process writes nothing.
    ``sharded`` names the entries held in parts (``held_in_parts``); ``meta`` is called on the
    process that writes the metadata."""
    whole = writes_whole(is_chief, sharded)
    if not whole and not sharded:
        return None
    arrays = {name: np.array(v.value, copy=True) for name, v in variables.items()
              if name not in sharded} if whole else {}
    info = meta() if whole else {}
    if not sharded:
        return functools.partial(save, directory, arrays, info)
    parts = {name: sharded_state.local_parts(variables[name].value) for name in sharded}
    return functools.partial(save_sharded, directory, arrays, parts, info, list(variables),
                             sharded_state.next_tag())


def _commit(root: Path, arrays: Mapping[str, np.ndarray], meta: dict[str, Any],
            staging: Path | None = None) -> Path:
    """Writes ``arrays`` and ``meta`` into ``staging`` (which may already hold shards; by
    default a new locked ``.staging-*`` directory), flushes it, moves it into place as the next
    version and records that as ``latest``; then removes the older versions. On failure the
    previous version stays the latest."""
    current = latest_version(root)
    number = 0 if current is None else int(current.name.split("-")[1]) + 1
    final = root / f"ckpt-{number}"
    if final.exists():  # moved into place by a writer killed before it recorded it as latest
        shutil.rmtree(final)
    remove_stale_temporaries(root / _LATEST)
    held = None
    try:
        if staging is None:
            staging = Path(tempfile.mkdtemp(dir=root, prefix=".staging-"))
            held = hold_directory(staging)
        with open(staging / "state.npz", "wb") as f:
            np.savez(f, **arrays)
            _flush(f)
        with open(staging / "meta.json", "w") as f:
            f.write(json.dumps(meta, sort_keys=True))
            _flush(f)
        fsync_directory(staging)
        os.replace(staging, final)
        fsync_directory(root)
        write_atomically(root / _LATEST, final.name)  # the commit, once the version is durable
    except BaseException as err:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if final.exists() and latest_version(root) != final:
            shutil.rmtree(final, ignore_errors=True)
        if isinstance(err, OSError):
            kept = (f"the previous checkpoint {current} is kept" if current
                    else "no earlier checkpoint existed")
            message = (f"Could not write checkpoint {final} in {root}: {err.strerror or err}; "
                       f"{kept}. Free space on that disk or choose another directory.")
            raise (type(err)(err.errno, message) if err.errno is not None
                   else type(err)(message)) from err
        raise
    finally:
        if held is not None:
            os.close(held)
    for old in root.glob("ckpt-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_version(directory: str | os.PathLike[str]) -> Path | None:
    """The directory of the newest complete checkpoint, or ``None``.

    Raises:
      ValueError: ``latest`` names anything but a ``ckpt-<n>`` version inside ``directory``
        (never a path elsewhere); the message names the file and the fix.
    """
    root = Path(directory)
    name = read_latest(root, _VERSION, "meta.json")
    if name is None or not (root / name / "meta.json").exists():
        return None
    return root / name


def load(directory: str | os.PathLike[str]
         ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The arrays (by name, in the order written) and metadata of the latest checkpoint, or
    ``None`` if there is none. An array that was sharded over processes comes as a
    ``sharded_state.Entry``, read when assigned (``assign``)."""
    version = latest_version(directory)
    if version is None:
        return None
    meta = json.loads((version / "meta.json").read_text())
    with np.load(version / "state.npz", allow_pickle=False) as data:
        arrays: dict[str, Any] = {name: data[name] for name in data.files}
    if "sharded" in meta:
        arrays.update(sharded_state.read_entries(version, meta["sharded"], meta["processes"]))
        arrays = {name: arrays[name] for name in meta["order"]}
    return arrays, meta


def assign(variable: Any, value: Any) -> None:
    """Assigns a loaded array (NumPy or ``sharded_state.Entry``) to ``variable``: a variable
    sharded over processes reads only its own shards, whatever layout wrote them."""
    variable.assign(sharded_state.value_for(variable, value))


def _flush(f: Any) -> None:
    """Flushes an open file to the disk."""
    f.flush()
    os.fsync(f.fileno())


def add_named(named: dict[str, Any], base: str, variable: Any) -> None:
    """Enters ``variable`` in ``named`` as ``base``, or ``base#1``, ``base#2``... when that
    entry name is taken (two variables with one path)."""
    name, n = base, 0
    while name in named:
        n += 1
        name = f"{base}#{n}"
    named[name] = variable


def match(arrays: dict[str, np.ndarray], variables: dict[str, Any], where: str, directory_arg: str
          ) -> list[tuple[Any, np.ndarray]]:
    """Pairs saved arrays with variables: by name when the names agree, else by position when
    count and shapes agree (a model built again in one process has new automatic names, e.g.
    ``sequential_1/dense_2``; a format-1 backup has no names).

    ``where`` names the checkpoint in the error (``"The backup in '/ckpt'"``), ``directory_arg``
    the argument to change.

    Raises:
        ValueError: neither way pairs every variable with an array of its shape.
    """
    if arrays.keys() == variables.keys():
        pairs = [(variables[name], value) for name, value in arrays.items()]
    else:
        pairs = list(zip(variables.values(), arrays.values(), strict=False))
    if len(arrays) == len(variables) and all(
            tuple(value.shape) == tuple(v.shape) for v, value in pairs):
        return pairs
    missing = sorted(variables.keys() - arrays.keys())[:5]
    raise ValueError(
        f"{where} does not match this model and optimizer ({len(arrays)} saved arrays, "
        f"{len(variables)} variables now; not in the checkpoint: {missing}). Use another "
        f"{directory_arg}, or delete this one to start over.")


def remove(directory: str | os.PathLike[str]) -> None:
    """Deletes every version and the ``latest`` pointer (e.g. after training completed)."""
    root = Path(directory)
    (root / _LATEST).unlink(missing_ok=True)
    for old in root.glob("ckpt-*"):
        shutil.rmtree(old, ignore_errors=True)
