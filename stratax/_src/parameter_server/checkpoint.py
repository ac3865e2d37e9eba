"""Checkpoints that change shape: full, unsharded variables with their optimizer state.

``strategy.save_checkpoint(path)`` gathers every variable from the parameter servers (shards
concatenated along axis 0) with its optimizer slots (Adam's ``m``/``v``, momentum's ``m``,
gathered the same way) and iteration counts, and writes one ``.npz`` file (raw arrays named
``value/<name>`` and ``slot/<slot>/<name>``, plus a JSON header; no pickle), atomically.
Because nothing in it depends on the placement, ``strategy.restore_checkpoint(path)`` restores
it with any number of parameter servers and any partitioner: each new shard takes its rows of
the values and slots (resharding on load).
``save_variables``/``load_variables`` write and read the same file from Keras variables (any
strategy, e.g. ``MirroredStrategy``), matched by name (a Keras variable's ``path``), with a
Keras ``SGD``/``Adam``'s slots and iterations when given the optimizer (the ps applies Keras'
formulas, so the state means the same on both sides).

Names: an entry is named by the variable's path inside its model: Keras' automatic name of the
top-level model (``sequential/``, ``functional_2/``) is dropped, because a model built in code
has it and the same model from ``keras.models.load_model`` does not. Reading matches a name
exactly, else with that leading model name stripped from either side, when one entry fits.

Iterations: each shard counts its own updates (row-sparse pushes touch only some shards), so
the file keeps one count per saved shard, by rows; a new shard takes the count of the saved
shard holding its first row. The ledger of step ids is not saved: a restore starts a new run.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stratax._src.parameter_server import sharded_checkpoint
from stratax._src.parameter_server.checkpoint_entries import (
    call,
    find,
    iterations_at,
    join,
    named,
)
from stratax._src.parameter_server.program import optimizer_spec
from stratax._src.parameter_server.tasks.optimizers import DEFAULT_SPARSE_UPDATES, ShardOptimizer
from stratax._src.parameter_server.tasks.snapshots import HEADER, write_npz
from stratax._src.parameter_server.transport import rpc, wire

# Version 2 names each array by its variable (``value/<name>``, ``slot/<slot>/<name>``);
# version 1 (still read) numbered them by entry (``value/<i>``, ``slot/<i>/<slot>``).
FORMAT, VERSION = "stratax-variables", 2


# ----- on the parameter server ------------------------------------------------------------
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


# ----- on the coordinator -----------------------------------------------------------------
def export_variables(strategy: Any, variables: Sequence[Any]
            ) -> dict[str, tuple[dict[str, Any], list[np.ndarray]]]:
    """Every shard of ``variables`` (``PSVariable``s): its state (optimizer key, slot names,
    iterations) and its tensors (value, then the slots), one ``export`` call per ps."""
    by_ps: dict[int, list[str]] = defaultdict(list)
    for var in variables:
        for p in var.placements:
            by_ps[p.ps].append(p.key)
    replies = strategy._ps.each({ps: call("export", {"names": names})
                                 for ps, names in by_ps.items()})
    shards: dict[str, tuple[dict[str, Any], list[np.ndarray]]] = {}
    for ps, names in by_ps.items():
        reply, position = replies[ps], 0
        for name, state in zip(names, reply.meta["shards"], strict=True):
            count = 1 + len(state["slots"])
            shards[name] = (state, reply.tensors[position:position + count])
            position += count
    return shards


def pull_keras_optimizer(strategy: Any, optimizer: Any,
                         pairs: Sequence[tuple[Any, Any]]) -> None:
    """Copies the parameter servers' optimizer slots of ``pairs`` (a Keras variable and its
    ``PSVariable``) into the slot variables of ``optimizer`` (a built Keras ``SGD``/``Adam``), so
    that ``model.save`` and ``get_weights`` of the optimizer hold the trained state. Shards
    without an optimizer (never trained) leave the Keras slots as they are."""
    _, slots_of = _keras_optimizer(optimizer, [keras_var for keras_var, _ in pairs])
    shards = export_variables(strategy, [ps_var for _, ps_var in pairs])
    for keras_var, ps_var in pairs:
        parts = [shards[p.key] for p in ps_var.placements]
        if parts[0][0]["optimizer"] is None:
            continue
        keras_slots = slots_of(keras_var)
        for j, slot in enumerate(parts[0][0]["slots"]):
            if slot in keras_slots:
                keras_slots[slot].assign(join([tensors[1 + j] for _, tensors in parts],
                                               ps_var.shape))


def push_keras_optimizer(strategy: Any, optimizer: Any,
                         pairs: Sequence[tuple[Any, Any]]) -> None:
    """Gives the parameter servers ``optimizer``'s state for ``pairs`` (a Keras variable and its
    ``PSVariable``): values, slots and iterations, resharded to the placement. A model whose
    optimizer was loaded (``keras.models.load_model``, a backup) trains on from that state."""
    key, slots_of = _keras_optimizer(optimizer, [keras_var for keras_var, _ in pairs])
    iterations = int(np.asarray(optimizer.iterations.numpy()))
    imports = _ShardImports()
    for keras_var, ps_var in pairs:
        slots = {name: np.asarray(slot.numpy())
                 for name, slot in sorted(slots_of(keras_var).items())}
        imports.add(ps_var, key, np.asarray(keras_var.numpy()), slots, lambda p: iterations)
    imports.send(strategy)


def save(strategy: Any, path: str | os.PathLike, variables: Sequence[Any],
         built_on_servers: Collection[str] = ()) -> None:
    """Writes ``variables`` (``PSVariable``s) with their optimizer state to ``path``: one
    ``.npz`` file, or a sharded checkpoint directory (``sharded_checkpoint``).

    Raises:
      ValueError: a ``.npz`` path for a variable named in ``built_on_servers`` (too large for
        the chief, which never holds it): the message names it; save to a directory instead.
    """
    if sharded_checkpoint.is_sharded(path):
        sharded_checkpoint.save(strategy, path, variables)
        return
    large = [v.name for v in variables if v.name in built_on_servers]
    if large:
        raise ValueError(
            f"save_checkpoint({str(path)!r}) would gather {large} whole on the chief, which "
            "never holds them (built by their parameter servers); save to a directory "
            "instead, e.g. strategy.save_checkpoint('ckpt'), where each server writes "
            "its own shards.")
    shards = export_variables(strategy, variables)
    entries, arrays = [], {}
    for i, var in enumerate(variables):
        parts = [shards[p.key] for p in var.placements]
        states = [state for state, _ in parts]
        keys = {state["optimizer"] for state in states}
        if len(keys) > 1:
            raise ValueError(f"The shards of {var.name!r} have different optimizers {keys}.")
        arrays[f"value/{i}"] = join([tensors[0] for _, tensors in parts], var.shape)
        for j, slot in enumerate(states[0]["slots"]):
            arrays[f"slot/{i}/{slot}"] = join([tensors[1 + j] for _, tensors in parts],
                                               var.shape)
        entries.append({"name": var.name, "shape": list(var.shape), "dtype": var.dtype.name,
                        "optimizer": states[0]["optimizer"], "slots": states[0]["slots"],
                        "iterations": [[p.start, p.rows, s["iterations"]]
                                       for p, s in zip(var.placements, states, strict=True)]})
    _write(path, entries, arrays)


def restore(strategy: Any, path: str | os.PathLike, variables: Sequence[Any]) -> list[str]:
    """Loads ``path`` into ``variables`` (``PSVariable``s, matched by name), resharding to
    their current placement; returns the names restored. A variable saved without optimizer
    state (``save_variables``) keeps the optimizer state its shards have. Raises on a missing
    name or a shape mismatch, naming both."""
    if sharded_checkpoint.is_sharded(path):
        return sharded_checkpoint.restore(strategy, path, variables)
    entries, data = _read(path)
    imports = _ShardImports()
    for var in variables:
        index, entry = find(entries, var.name, tuple(var.shape), path)
        slots = {s: data[f"slot/{index}/{s}"] for s in entry["slots"]}
        imports.add(var, entry["optimizer"], data[f"value/{index}"], slots,
                    lambda p, blocks=entry["iterations"]: iterations_at(blocks, p.start))
    imports.send(strategy)
    return [var.name for var in variables]


class _ShardImports:
    """The ``import`` calls that give each ps its shards' rows of values and slots, one call
    per ps."""

    def __init__(self) -> None:
        self._calls: dict[int, tuple[list[str], list[dict[str, Any]], list[np.ndarray]]] = (
            defaultdict(lambda: ([], [], [])))

    def add(self, var: Any, optimizer: str, value: np.ndarray, slots: dict[str, np.ndarray],
            iterations: Callable[[Any], int]) -> None:
        """Queues ``var``'s shards: their rows of ``value`` and ``slots``, and the update count
        ``iterations(placement)``."""
        for p in var.placements:
            rows = slice(p.start, p.start + p.rows) if var.shape else slice(None)
            names, states, tensors = self._calls[p.ps]
            names.append(p.key)
            states.append({"optimizer": optimizer, "slots": list(slots),
                           "iterations": iterations(p)})
            tensors += [value[rows], *(slot[rows] for slot in slots.values())]

    def send(self, strategy: Any) -> None:
        strategy._ps.each({ps: call("import", {"names": names, "shards": states}, tensors)
                           for ps, (names, states, tensors) in self._calls.items()})


# Keras' names of the optimizer slots the ps keeps as "m" and "v" (Keras creates them with
# ``add_variable_from_reference(var, name)``: path ``<optimizer>/<var path with _>_<name>``).
_KERAS_SLOTS = {"Adam": {"m": "momentum", "v": "velocity"}, "SGD": {"m": "momentum"}}


def save_variables(path: str | os.PathLike, variables: Sequence[Any],
                   optimizer: Any = None) -> None:
    """Writes Keras variables (any strategy; named by their ``path``) in the checkpoint format,
    with ``optimizer``'s state for them when given (a built Keras ``SGD`` or ``Adam``).
    ``strategy.restore_checkpoint`` reads it.

    Example:
      >>> sx.checkpoint.save_variables("model.npz", model.trainable_variables,
      ...                              model.optimizer)                        # doctest: +SKIP
    """
    key, slots_of = _keras_optimizer(optimizer, variables)
    entries, arrays = [], {}
    for i, var in enumerate(variables):
        value = np.asarray(var.numpy())
        arrays[f"value/{i}"] = value
        slots = slots_of(var)
        for name, slot in slots.items():
            arrays[f"slot/{i}/{name}"] = np.asarray(slot.numpy())
        iterations = int(np.asarray(optimizer.iterations.numpy())) if optimizer else 0
        entries.append({"name": var.path, "shape": list(value.shape), "dtype": value.dtype.name,
                        "optimizer": key if optimizer else None, "slots": sorted(slots),
                        "iterations": [[0, value.shape[0] if value.shape else 1, iterations]]})
    _write(path, entries, arrays)


def load_variables(path: str | os.PathLike, variables: Sequence[Any],
                   optimizer: Any = None) -> list[str]:
    """Assigns Keras variables (matched by ``path``) from a checkpoint written under any
    strategy and placement (e.g. ``ParameterServerStrategy.save_checkpoint``), and, when
    ``optimizer`` (a Keras ``SGD`` or ``Adam``) is given, its slots and iterations; returns the
    names loaded."""
    entries, data = _read(path)  # a sharded directory's arrays are read as they are used
    if optimizer is not None and not optimizer.built:
        optimizer.build(list(variables))
    key, slots_of = _keras_optimizer(optimizer, variables)
    for var in variables:
        index, entry = find(entries, var.path, tuple(var.shape), path)
        var.assign(data[f"value/{index}"])
        if optimizer is None:
            continue
        if entry["optimizer"] is None or json.loads(entry["optimizer"])["spec"]["class_name"] \
                != json.loads(key)["spec"]["class_name"]:
            raise ValueError(f"Checkpoint {str(path)!r} has no {type(optimizer).__name__} state "
                             f"for {var.path!r}; load it without `optimizer`.")
        for name, slot in slots_of(var).items():
            slot.assign(data[f"slot/{index}/{name}"])
        optimizer.iterations.assign(iterations_at(entry["iterations"], 0))
    return [var.path for var in variables]


def _keras_optimizer(optimizer: Any, variables: Sequence[Any]) -> tuple[str, Any]:
    """The ps' key of a Keras optimizer and a function giving a variable's slots by ps name."""
    if optimizer is None:
        return "", lambda var: {}
    spec = optimizer_spec(optimizer)
    template = ShardOptimizer(spec, np.zeros((1,), np.float32))  # checks it is SGD/Adam
    names = {k: v for k, v in _KERAS_SLOTS[template.name].items() if k in template.slots}
    by_path = {v.path: v for v in optimizer.variables}

    def slots_of(var: Any) -> dict[str, Any]:
        prefix = var.path.replace("/", "_")
        found = {ps_name: [v for p, v in by_path.items() if p.endswith(f"/{prefix}_{keras}")]
                 for ps_name, keras in names.items()}
        missing = [k for k, v in found.items() if len(v) != 1]
        if missing:
            raise ValueError(f"{type(optimizer).__name__} has no single {missing} slot for "
                             f"{var.path!r}; build it on these variables first.")
        return {k: v[0] for k, v in found.items()}

    sparse = getattr(optimizer, "stratax_sparse_updates", DEFAULT_SPARSE_UPDATES)
    return json.dumps({"spec": spec, "sparse": sparse}, sort_keys=True), slots_of


# ----- the file -----------------------------------------------------------------------------
def _write(path: str | os.PathLike, entries: list[dict[str, Any]],
           arrays: dict[str, np.ndarray]) -> None:
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"Checkpoint path {str(path)!r} must end with '.npz'.")
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = named(entries)
    write_npz(path, {"format": FORMAT, "version": VERSION, "variables": entries},
              {_array_key(key, entries): value for key, value in arrays.items()})


def _array_key(key: str, entries: list[dict[str, Any]], named: bool = True) -> str:
    """An array's key in the file (``value/<name>``, ``slot/<slot>/<name>``) from its key by
    entry number (``value/<i>``, ``slot/<i>/<slot>``), or back with ``named=False``."""
    kind, rest = key.split("/", 1)
    if named:
        index, _, slot = rest.partition("/")
        name = entries[int(index)]["name"]
        return f"value/{name}" if kind == "value" else f"slot/{slot}/{name}"
    for index, entry in enumerate(entries):
        if kind == "value" and rest == entry["name"]:
            return f"value/{index}"
        for slot in entry["slots"]:
            if kind == "slot" and rest == f"{slot}/{entry['name']}":
                return f"slot/{index}/{slot}"
    raise ValueError(f"Checkpoint array {key!r} belongs to no variable of its header.")


def _read(path: str | os.PathLike) -> tuple[list[dict[str, Any]], Any]:
    """The entries of the checkpoint ``path`` and its arrays by entry number (``value/<i>``,
    ``slot/<i>/<slot>``): a dict for a ``.npz`` file, a reader for a sharded directory."""
    if sharded_checkpoint.is_sharded(path):
        version, entries = sharded_checkpoint.read_manifest(path)
        return entries, _ShardedArrays(version, entries)
    with np.load(path, allow_pickle=False) as npz:
        data = {k: np.array(npz[k]) for k in npz.files}
    header = json.loads(data.pop(HEADER).tobytes())
    if header.get("format") != FORMAT or header.get("version") not in (1, VERSION):
        raise ValueError(f"{str(path)!r} is not a stratax variables checkpoint (version 1 "
                         f"or {VERSION}); its header says {header.get('format')!r} "
                         f"{header.get('version')!r}.")
    entries = header["variables"]
    if header["version"] == 1:
        return entries, data
    return entries, {_array_key(key, entries, named=False): value for key, value in data.items()}




class _ShardedArrays:
    """``data[key]`` of ``_read`` for a sharded checkpoint: each array assembled from its parts
    when asked for, from the version the manifest was read from (read once)."""

    def __init__(self, version: Path, entries: list[dict[str, Any]]) -> None:
        self._version, self._entries = version, entries

    def __getitem__(self, key: str) -> np.ndarray:
        kind, index, *slot = key.split("/")
        return sharded_checkpoint.load_whole(self._version, self._entries[int(index)],
                                             slot[0] if kind == "slot" else None)
