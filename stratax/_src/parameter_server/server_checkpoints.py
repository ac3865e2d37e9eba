"""A ``ParameterServerStrategy``'s checkpoints, taken through its parameter servers.

``strategy.save_checkpoint(path)`` writes the variables with their optimizer state (Adam's
``m``/``v``, momentum's ``m``) and iteration counts in a format that does not depend on the
placement, so ``strategy.restore_checkpoint(path)`` restores it with any number of parameter
servers and any partitioner, and ``sx.checkpoint.load_variables`` into Keras under any strategy:

- a ``.npz`` file (``checkpoint/variables_file.py``): the chief gathers every variable from the
  servers (``export``, shards concatenated along axis 0) and writes it whole; a restore gives
  each new shard its rows (``import``);
- a directory (``checkpoint/sharded_variables.py``): every server writes its own shards
  (``save_shards``) and the chief commits the version; on restore each server reads the saved
  rows of its shards (``load_shards``).

The servers' side of those calls is ``tasks/checkpoint_methods.py``. The ledger of step ids is
not saved: a restore starts a new run. ``CheckpointMethods`` gives the strategy its checkpoint
methods.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from stratax._src.checkpoint import sharded_variables, variables_file
from stratax._src.checkpoint.entries import find, iterations_at, join
from stratax._src.parameter_server.optimizer_state import keras_optimizer_state

logger = logging.getLogger(__name__)


def call(method: str, meta: dict[str, Any], tensors: Sequence[np.ndarray] = ()) -> Any:
    """A ``PSClients.each`` call of ``method`` (streamed: shards may be large)."""
    return lambda client: client.call(method, meta, list(tensors), stream=True)


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
    _, slots_of = keras_optimizer_state(optimizer, [keras_var for keras_var, _ in pairs])
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
    key, slots_of = keras_optimizer_state(optimizer, [keras_var for keras_var, _ in pairs])
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
    ``.npz`` file, or a sharded checkpoint directory (``save_sharded``).

    Raises:
      ValueError: a ``.npz`` path for a variable named in ``built_on_servers`` (too large for
        the chief, which never holds it): the message names it; save to a directory instead.
    """
    if sharded_variables.is_sharded(path):
        save_sharded(strategy, path, variables)
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
    variables_file.write(path, entries, arrays)


def restore(strategy: Any, path: str | os.PathLike, variables: Sequence[Any]) -> list[str]:
    """Loads ``path`` into ``variables`` (``PSVariable``s, matched by name), resharding to
    their current placement; returns the names restored. A variable saved without optimizer
    state (``save_variables``) keeps the optimizer state its shards have. Raises on a missing
    name or a shape mismatch, naming both."""
    if sharded_variables.is_sharded(path):
        return restore_sharded(strategy, path, variables)
    entries, data = variables_file.read(path)
    imports = _ShardImports()
    for var in variables:
        index, entry = find(entries, var.name, tuple(var.shape), path)
        slots = {s: data[f"slot/{index}/{s}"] for s in entry["slots"]}
        imports.add(var, entry["optimizer"], data[f"value/{index}"], slots,
                    lambda p, blocks=entry["iterations"]: iterations_at(blocks, p.start))
    imports.send(strategy)
    return [var.name for var in variables]


def save_sharded(strategy: Any, path: str | os.PathLike, variables: Sequence[Any]) -> str:
    """Writes ``variables`` (``PSVariable``s) as a new version of the sharded checkpoint
    ``path`` (``checkpoint/sharded_variables.py``); returns the version's name."""
    root, version, current = sharded_variables.new_version(path)
    by_ps: dict[int, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    files: dict[str, str] = {}
    for var in variables:
        for p in var.placements:
            names, part_files = by_ps[p.ps]
            files[p.key] = f"ps{p.ps}/{len(files)}"
            names.append(p.key)
            part_files.append(files[p.key])
    replies = strategy._ps.each({
        ps: call("save_shards", {"dir": str(version), "names": names,
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
    sharded_variables.commit(root, version, current, entries)
    return version.name


def restore_sharded(strategy: Any, path: str | os.PathLike, variables: Sequence[Any],
                    version_name: str | None = None) -> list[str]:
    """Loads the committed version of ``path`` (or ``version_name``) into ``variables``
    (matched by name as in the single-file format), each ps reading the saved rows of its own
    shards; returns the names."""
    version, entries = sharded_variables.read_manifest(path, version_name)
    calls: dict[int, tuple[list[str], list[dict[str, Any]]]] = defaultdict(lambda: ([], []))
    restored = set()
    for var in variables:
        index, entry = find(entries, var.name, tuple(var.shape), path)
        restored.add(index)
        for p in var.placements:
            names, plans = calls[p.ps]
            rows = p.rows if var.shape else 1
            sources = sharded_variables.sources(entry["parts"], p.start, rows)
            names.append(p.key)
            plans.append({"sources": sources, "slots": entry["slots"],
                          "optimizer": entry["optimizer"],
                          "iterations": sharded_variables.iterations_at(entry["parts"],
                                                                         p.start)})
    strategy._ps.each({ps: call("load_shards", {"dir": str(version), "names": names,
                                                "shards": plans})
                       for ps, (names, plans) in calls.items()})
    left = [e["name"] for i, e in enumerate(entries) if i not in restored]
    if left:
        logger.warning(
            "restore_checkpoint(%r) left %d saved variable(s) unrestored, which this strategy "
            "has not placed yet: %s. Pass the model's variables to place and restore them "
            "too: strategy.restore_checkpoint(path, model.variables).", str(path), len(left),
            ", ".join(left[:8]) + (" ..." if len(left) > 8 else ""))
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


class CheckpointMethods:
    """``ParameterServerStrategy``'s checkpoint methods; they read the strategy's variables
    (``_store``) and call its servers (``_ps``)."""

    _store: Any

    def pull_optimizer_state(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """Copies the servers' optimizer slots of the placed Keras ``variables`` into the Keras
        ``optimizer``'s (see ``pull_keras_optimizer``): saves hold the trained state."""
        pairs = self._store.placed_pairs(variables)
        if pairs and optimizer is not None and optimizer.built:
            pull_keras_optimizer(self, optimizer, pairs)

    def push_optimizer_state(self, optimizer: Any, variables: Sequence[Any]) -> None:
        """Gives the servers the Keras ``optimizer``'s state (slots, iterations) and the values
        of the placed Keras ``variables``: a loaded model trains on from its saved state."""
        pairs = self._store.placed_pairs(variables)
        if pairs and optimizer is not None and optimizer.built:
            push_keras_optimizer(self, optimizer, pairs)

    def save_checkpoint(self, path: str, variables: Sequence[Any] | None = None) -> None:
        """Writes ``variables`` (default: all) with their optimizer state to ``path``.

        A directory (a path without ``.npz``): each parameter server writes its own shards in
        parallel and the chief commits the version with a manifest, so no process holds a
        variable whole and a save killed at any point leaves the previous version (see
        ``checkpoint/sharded_variables.py``). A ``.npz`` file: the variables whole, from the
        chief, for models that fit it. Either restores with any number of parameter servers and
        any partitioner, and into Keras under any strategy (``sx.checkpoint.load_variables``).

        Raises:
          ValueError: a ``.npz`` path for a variable built by its servers (too large for the
            chief): the message names it; save to a directory instead.
        """
        save(self, path, self._store.chosen(variables), self._store.built_on_servers)

    def restore_checkpoint(self, path: str, variables: Sequence[Any] | None = None) -> list[str]:
        """Loads ``path`` (a directory or ``.npz`` file from ``save_checkpoint``, or
        ``sx.checkpoint.save_variables``' file) into ``variables`` (default: all; Keras
        variables are matched by ``path``), resharding to this strategy's placement; returns
        the names restored. From a directory each parameter server reads only the saved rows
        of its own shards."""
        return restore(self, path, self._store.chosen(variables))

    def save_checkpoint_version(self, path: str, variables: Sequence[Any]) -> str:
        """``save_checkpoint`` into the directory ``path``; returns the version written, which
        ``restore_checkpoint_version`` reads while ``path`` keeps it (the newest two)."""
        return save_sharded(self, path, self._store.chosen(variables))

    def restore_checkpoint_version(self, path: str, version: str,
                                   variables: Sequence[Any]) -> list[str]:
        """``restore_checkpoint`` of one version of the directory ``path`` (not its newest
        necessarily): the one a backup recorded."""
        return restore_sharded(self, path, self._store.chosen(variables), version)
