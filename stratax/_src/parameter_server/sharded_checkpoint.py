"""Sharded checkpoints: each parameter server writes and reads its own shards, in parallel.

``strategy.save_checkpoint(directory)`` (a path without ``.npz``) asks every ps to write its
shards of the variables (values, optimizer slots) as ``.npy`` files into a new version
directory, fsynced; the chief then writes ``manifest.json`` (names, shapes, row ranges, the
optimizer and update counts of each part: no tensor), and commits the version by rewriting the
``latest`` file atomically. Until that rename, a reader sees the previous version whole: a save
killed at any point loses nothing. The versions before the previous one are removed.

``restore_checkpoint(directory)`` sends each ps, for each of its shards, the saved row ranges
that cover it; the ps reads them with memory-mapped files straight into its shard, so no task
reads more than its own shards, and any number of ps and any partitioner restore any saved
placement. ``sx.checkpoint.load_variables`` reads the same directory into Keras variables
(whole, for a model that fits one process).

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
import logging
import os
import re
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stratax._src.core.files import fsync_directory, write_atomically
from stratax._src.parameter_server import checkpoint_entries as entries_lib
from stratax._src.parameter_server.tasks.optimizers import ShardOptimizer
from stratax._src.parameter_server.transport import rpc, wire

logger = logging.getLogger(__name__)
FORMAT, VERSION = "stratax-sharded", 1
LATEST, MANIFEST = "latest", "manifest.json"
_VERSION_NAME = re.compile(r"v(\d+)")
_PART_FILE = re.compile(r"ps\d+/\d+(\.[A-Za-z0-9_]+)?\.npy")


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether ``path`` names a sharded checkpoint (not a ``.npz`` file)."""
    return Path(path).suffix != ".npz"


# ----- on the parameter server ------------------------------------------------------------
def save_shards(server: Any, frame: wire.Frame) -> bytes:
    """ps method ``save_shards``: writes each named shard's value and slots as ``.npy`` files
    under ``dir`` (``ps<i>/<part>.npy``, ``ps<i>/<part>.<slot>.npy``), fsynced; replies with
    each shard's optimizer key, slot names and update count."""
    version = _version_dir(frame.meta)
    names = wire.require(frame.meta, "names", list)
    files = wire.require(frame.meta, "files", list)
    if len(names) != len(files) or not all(
            isinstance(f, str) and _PART_FILE.fullmatch(f"{f}.npy") for f in files):
        raise wire.WireError(f"save_shards: names and files must align, files as 'ps<i>/<n>', "
                             f"got {names} and {files}.")
    shards = [server._shard(name) for name in names]
    states = []
    for shard, file in zip(shards, files, strict=True):
        target = version / file
        target.parent.mkdir(parents=True, exist_ok=True)
        with shard.lock:  # pushes wait while this shard is written, not copied
            opt = shard.optimizer
            slots = sorted(opt.slots) if opt else []
            write_part(target.with_name(f"{target.name}.npy"), shard.value)
            for slot in slots:
                write_part(target.with_name(f"{target.name}.{slot}.npy"), opt.slots[slot])
            states.append({"optimizer": shard.optimizer_key or None, "slots": slots,
                           "iterations": opt.iterations if opt else 0})
    for directory in {(version / f).parent for f in files}:
        fsync_directory(directory)
    return rpc.response({"shards": states})


def load_shards(server: Any, frame: wire.Frame) -> bytes:
    """ps method ``load_shards``: fills each named shard (value, and slots when saved with an
    optimizer) from the saved row ranges ``sources`` (``[file, first row in file, rows, first
    row in shard]``), read through memory maps; everything is checked before a shard
    changes."""
    version = _version_dir(frame.meta)
    names = wire.require(frame.meta, "names", list)
    plans = wire.require(frame.meta, "shards", list)
    if len(names) != len(plans):
        raise wire.WireError(f"load_shards got {len(names)} names and {len(plans)} plans.")
    checked = []
    for name, plan in zip(names, plans, strict=True):
        shard = server._shard(name)
        sources = wire.require(plan, "sources", list)
        slots = wire.require(plan, "slots", list)
        covered = 0
        for source in sources:
            if not (isinstance(source, list) and len(source) == 4 and isinstance(source[0], str)
                    and _PART_FILE.fullmatch(f"{source[0]}.npy")
                    and all(isinstance(n, int) and n >= 0 for n in source[1:])):
                raise wire.WireError(f"load_shards: bad source {source!r} for {name!r}.")
            covered += source[2]
        rows = shard.value.shape[0] if shard.value.ndim else 1
        if covered != rows:
            raise wire.WireError(f"load_shards: the sources of {name!r} cover {covered} rows, "
                                 f"the shard has {rows}.")
        key = plan.get("optimizer")
        parsed = json.loads(wire.require(plan, "optimizer", str)) if key is not None else None
        iterations = wire.require(plan, "iterations", int) if key is not None else 0
        checked.append((shard, sources, slots, key, parsed, iterations))
    for shard, sources, slots, key, parsed, iterations in checked:
        with shard.lock:
            read_rows_into(shard.value, version, sources, "")
            if parsed is None:
                continue
            optimizer = shard.optimizer if shard.optimizer_key == key else None
            if optimizer is None:  # the old slots go before the new ones are allocated
                shard.optimizer, shard.optimizer_key = None, ""
                optimizer = ShardOptimizer(parsed["spec"], shard.value, parsed["sparse"])
            for slot in slots:  # in place: a ps never holds two copies of its slots
                read_rows_into(optimizer.slots[slot], version, sources, f".{slot}")
            optimizer.iterations = int(iterations)
            shard.optimizer, shard.optimizer_key = optimizer, key
    return rpc.response()


def _version_dir(meta: dict[str, Any]) -> Path:
    version = Path(wire.require(meta, "dir", str))
    if not version.is_absolute() or not _VERSION_NAME.fullmatch(version.name):
        raise wire.WireError(f"A checkpoint version directory is an absolute path ending in "
                             f"v<n>, got {str(version)!r}.")
    return version


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


# ----- on the coordinator -----------------------------------------------------------------
def save(strategy: Any, path: str | os.PathLike, variables: Sequence[Any]) -> str:
    """Writes ``variables`` (``PSVariable``s) as a new version of the sharded checkpoint
    ``path`` (see the module docstring); returns the version's name."""
    root = Path(path).absolute()
    root.mkdir(parents=True, exist_ok=True)
    current = _committed(root)
    number = max([int(m.group(1)) for e in root.iterdir()
                  if (m := _VERSION_NAME.fullmatch(e.name))] + [0]) + 1
    version = root / f"v{number}"
    version.mkdir()
    by_ps: dict[int, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    files: dict[str, str] = {}
    for var in variables:
        for p in var.placements:
            names, part_files = by_ps[p.ps]
            files[p.key] = f"ps{p.ps}/{len(files)}"
            names.append(p.key)
            part_files.append(files[p.key])
    replies = strategy._ps.each({
        ps: entries_lib.call("save_shards", {"dir": str(version), "names": names,
                                            "files": part_files})
        for ps, (names, part_files) in by_ps.items()})
    states = {}
    for ps, (names, _) in by_ps.items():
        states.update(zip(names, replies[ps].meta["shards"], strict=True))
    entries = []
    for var in variables:
        parts = [(p, states[p.key]) for p in var.placements]
        keys = {state["optimizer"] for _, state in parts}
        if len(keys) > 1:
            raise ValueError(f"The shards of {var.name!r} have different optimizers {keys}.")
        entries.append({"name": var.name, "shape": list(var.shape), "dtype": var.dtype.name,
                        "optimizer": parts[0][1]["optimizer"], "slots": parts[0][1]["slots"],
                        "parts": [{"file": files[p.key], "start": p.start, "rows": p.rows,
                                   "iterations": s["iterations"]} for p, s in parts]})
    write_atomically(version / MANIFEST, json.dumps(
        {"format": FORMAT, "version": VERSION, "variables": entries_lib.named(entries)}))
    fsync_directory(root)
    write_atomically(root / LATEST, version.name)  # the commit
    for entry in root.iterdir():  # keep the new version and the one before it
        if _VERSION_NAME.fullmatch(entry.name) and entry.name not in (version.name, current):
            shutil.rmtree(entry, ignore_errors=True)
    return version.name


def restore(strategy: Any, path: str | os.PathLike, variables: Sequence[Any],
            version_name: str | None = None) -> list[str]:
    """Loads the committed version of ``path`` (or ``version_name``) into ``variables``
    (matched by name as in the single-file format), each ps reading the saved rows of its own
    shards; returns the names."""
    version, entries = read_manifest(path, version_name)
    calls: dict[int, tuple[list[str], list[dict[str, Any]]]] = defaultdict(lambda: ([], []))
    restored = set()
    for var in variables:
        index, entry = entries_lib.find(entries, var.name, tuple(var.shape), path)
        restored.add(index)
        for p in var.placements:
            names, plans = calls[p.ps]
            sources = _sources(entry["parts"], p.start, p.rows if var.shape else 1)
            names.append(p.key)
            plans.append({"sources": sources, "slots": entry["slots"],
                          "optimizer": entry["optimizer"],
                          "iterations": _iterations_at(entry["parts"], p.start)})
    strategy._ps.each({ps: entries_lib.call("load_shards", {"dir": str(version),
                                                            "names": names, "shards": plans})
                       for ps, (names, plans) in calls.items()})
    left = [e["name"] for i, e in enumerate(entries) if i not in restored]
    if left:
        logger.warning(
            "restore_checkpoint(%r) left %d saved variable(s) unrestored, which this strategy "
            "has not placed yet: %s. Pass the model's variables to place and restore them "
            "too: strategy.restore_checkpoint(path, model.variables).", str(path), len(left),
            ", ".join(left[:8]) + (" ..." if len(left) > 8 else ""))
    return [var.name for var in variables]


def read_manifest(path: str | os.PathLike, version_name: str | None = None
                  ) -> tuple[Path, list[dict[str, Any]]]:
    """The committed version directory of ``path`` (or its version ``version_name``) and its
    variables' entries.

    Raises:
      ValueError: no ``latest`` file, one that names no version inside ``path``, or a
        manifest that is not this format; the message names the file and the fix.
    """
    root = Path(path).absolute()
    if version_name is not None and not _VERSION_NAME.fullmatch(version_name):
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
    read_rows_into(value, version, _sources(entry["parts"], 0, rows), f".{slot}" if slot else "")
    return value


def _committed(root: Path) -> str | None:
    """The version ``root/latest`` names, checked to be a version directory inside ``root``.

    Raises:
      ValueError: ``latest`` holds anything but the name of an existing ``v<n>`` directory.
    """
    latest = root / LATEST
    if not latest.exists():
        return None
    name = latest.read_text(errors="replace").strip()
    if not _VERSION_NAME.fullmatch(name) or not (root / name).is_dir():
        raise ValueError(f"{latest} holds {name[:80]!r}, not the name of a checkpoint version "
                         f"in {root} (v<n>): the file is corrupt. Write it with the name of "
                         f"the newest complete version there ({_complete(root) or 'none'}), "
                         "or remove the directory to start afresh.")
    return name


def _complete(root: Path) -> str | None:
    versions = sorted((int(m.group(1)), e.name) for e in root.iterdir()
                      if (m := _VERSION_NAME.fullmatch(e.name)) and (e / MANIFEST).exists())
    return versions[-1][1] if versions else None


def _sources(parts: list[dict[str, Any]], start: int, rows: int) -> list[list[Any]]:
    """The saved row ranges covering rows ``start .. start + rows``: ``[file, first row in
    the file, rows, first row in the target]``."""
    sources = []
    for part in parts:
        lo = max(start, part["start"])
        hi = min(start + rows, part["start"] + max(part["rows"], 1))
        if lo < hi:
            sources.append([part["file"], lo - part["start"], hi - lo, lo - start])
    return sources


def _iterations_at(parts: list[dict[str, Any]], row: int) -> int:
    return entries_lib.iterations_at([[p["start"], p["rows"], p["iterations"]] for p in parts],
                                    row)
