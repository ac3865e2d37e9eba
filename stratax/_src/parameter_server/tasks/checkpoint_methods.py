"""A parameter server's side of checkpoints: the ps methods that hand out and take in its
shards (``export``/``import``, for the single-file format and the Keras optimizer state) and
that write and read them as parts of a sharded checkpoint (``save_shards``/``load_shards``,
``checkpoint/sharded_variables.py``). The chief's side is ``server_checkpoints``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stratax._src.checkpoint.files import fsync_directory
from stratax._src.checkpoint.sharded_variables import (
    PART_FILE,
    VERSION_NAME,
    read_rows_into,
    write_part,
)
from stratax._src.parameter_server.tasks.optimizers import ShardOptimizer
from stratax._src.parameter_server.transport import rpc, wire


def export_shards(server: Any, frame: wire.Frame) -> bytes:
    """ps method ``export``: per named shard, its value then its optimizer slots (sorted by
    name); the header gives each shard's optimizer key, iterations and slot names."""
    meta, tensors = [], []
    for name in wire.require(frame.meta, "names", list):
        shard = server._shard(name)
        with shard.lock:
            opt = shard.optimizer
            slots = sorted(opt.slots) if opt else []
            meta.append({"optimizer": shard.optimizer_key or None, "slots": slots,
                         "iterations": opt.iterations if opt else 0})
            tensors += [shard.value.copy(), *(opt.slots[s].copy() for s in slots)]
    return rpc.response({"shards": meta}, tensors)


def import_shards(server: Any, frame: wire.Frame) -> bytes:
    """ps method ``import``: sets the named shards' values and (when given) optimizer state;
    everything is checked before any shard changes."""
    names = wire.require(frame.meta, "names", list)
    states = wire.require(frame.meta, "shards", list)
    if len(states) != len(names):
        raise wire.WireError(f"import got {len(names)} names and {len(states)} shard states.")
    plan, position = [], 0
    for name, state in zip(names, states, strict=True):
        shard = server._shard(name)
        slots = wire.require(state, "slots", list)
        tensors = frame.tensors[position:position + 1 + len(slots)]
        position += 1 + len(slots)
        if len(tensors) != 1 + len(slots) or any(t.shape != shard.value.shape for t in tensors):
            raise wire.WireError(f"import: {name!r} needs {1 + len(slots)} tensors of shape "
                                 f"{shard.value.shape}.")
        optimizer, key = None, state.get("optimizer")
        if key is not None:
            parsed = json.loads(wire.require(state, "optimizer", str))
            optimizer = ShardOptimizer(parsed["spec"], shard.value, parsed["sparse"])
            if sorted(optimizer.slots) != sorted(slots):
                raise wire.WireError(f"import: {name!r} has slots {slots}, its optimizer "
                                     f"{sorted(optimizer.slots)}.")
            optimizer.iterations = int(wire.require(state, "iterations", int))
            for slot, value in zip(slots, tensors[1:], strict=True):
                optimizer.slots[slot][...] = value
        plan.append((shard, tensors[0], optimizer, key))
    if position != len(frame.tensors):
        raise wire.WireError(f"import got {len(frame.tensors)} tensors, expected {position}.")
    for shard, value, optimizer, key in plan:
        with shard.lock:
            shard.value[...] = value
            if optimizer is not None:
                shard.optimizer, shard.optimizer_key = optimizer, key
    return rpc.response()


def save_shards(server: Any, frame: wire.Frame) -> bytes:
    """ps method ``save_shards``: writes each named shard's value and slots as ``.npy`` files
    under ``dir`` (``ps<i>/<part>.npy``, ``ps<i>/<part>.<slot>.npy``), fsynced; replies with
    each shard's optimizer key, slot names and update count."""
    version = _version_dir(frame.meta)
    names = wire.require(frame.meta, "names", list)
    files = wire.require(frame.meta, "files", list)
    if len(names) != len(files) or not all(
            isinstance(f, str) and PART_FILE.fullmatch(f"{f}.npy") for f in files):
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
                    and PART_FILE.fullmatch(f"{source[0]}.npy")
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
    if not version.is_absolute() or not VERSION_NAME.fullmatch(version.name):
        raise wire.WireError(f"A checkpoint version directory is an absolute path ending in "
                             f"v<n>, got {str(version)!r}.")
    return version
