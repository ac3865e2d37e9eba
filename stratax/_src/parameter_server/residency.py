"""Hybrid mode, on the chief: where the replicas of the resident variables are, and moving them.

Under ``ParameterServerStrategy(dense_variables="workers")`` every variable a step does not read
row-sparse is *resident*: each worker trains its own replica of it (``resident``). The parameter
servers keep the placement and, outside a training call, the values: a worker gets its replica
before its first step (from a live worker that has one, else from the servers), and the
replica goes back to the servers when the coordinator joins and before a save, so everything
that reads the servers (``refresh_keras_variables``, checkpoints, ``optimizer_iterations``)
sees the trained values. A restarted worker gets a live worker's replica, ledger included (see
``resident`` for why that keeps the replicas equal).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from stratax._src.core.config import config
from stratax._src.parameter_server import server_checkpoints
from stratax._src.parameter_server.program import Program
from stratax._src.parameter_server.variables import PSVariable


class Residency:
    """Which worker holds a replica of which resident variable (``worker.resident``: shard
    keys), and the copies between workers and parameter servers."""

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy
        self._resident: dict[str, PSVariable] = {}   # name -> variable
        self._tables: set[str] = set()               # names read row-sparse
        self._lock = threading.Lock()

    def track(self, built: Program) -> None:
        """Marks what ``built`` reads whole as resident (``meta["resident"]``); refuses a
        variable read whole by one step and row-sparse by another."""
        sparse = set(built.meta["sparse"])
        resident = [v for v in built.variables if v.name not in sparse]
        both = sorted({v.name for v in resident} & self._tables
                      | sparse & set(self._resident))
        if both:
            raise ValueError(
                f"Variables {both} are read row-sparse (strategy.read_rows) by one step and "
                "whole by another; under dense_variables='workers' a table stays on the "
                "parameter servers only if every step reads it by rows. Read it one way, or set "
                "`layer.stratax_sparse = False` on its Embedding layer to replicate it.")
        self._tables |= sparse
        self._resident.update((v.name, v) for v in resident)
        built.meta["resident"] = [v.name for v in resident]

    def ensure(self, worker: Any, workers: Sequence[Any], programs: Sequence[Program]) -> None:
        """Gives ``worker`` the replicas the ``programs`` read that it lacks: a live worker's
        (values, slots, ledger), else the parameter servers'."""
        variables = {n: self._resident[n] for p in programs for n in p.meta.get("resident", ())}
        missing = [v for v in variables.values()
                   if any(p.key not in worker.resident for p in v.placements)]
        if not missing:
            return
        with self._lock:
            keys = [p.key for v in missing for p in v.placements]
            source = next((w for w in workers if w is not worker and w.alive and not w.restarted
                           and set(keys) <= w.resident), None)
            if source is not None:
                reply = source.client.call("resident_export", {"names": keys}, stream=True)
                meta = {"names": keys, "shards": reply.meta["shards"],
                        "ledgers": reply.meta["ledgers"], "previous": reply.meta["previous"]}
                tensors = reply.tensors
            else:
                shards = server_checkpoints.export_variables(self._strategy, missing)
                meta = {"names": keys, "shards": [shards[k][0] for k in keys]}
                tensors = [t for k in keys for t in shards[k][1]]
            worker.client.call("resident_load", meta, tensors, stream=True)
            worker.resident.update(keys)

    def flush(self, workers: Sequence[Any]) -> None:
        """Copies the trained replicas back to the parameter servers (values, slots, update
        counts), from a live worker that holds them all."""
        with self._lock:
            keys = sorted({k for w in workers for k in w.resident})
            if not keys:
                return
            source = next((w for w in workers if w.alive and not w.restarted
                           and set(keys) <= w.resident), None)
            if source is None:
                raise RuntimeError(
                    "No live worker holds the trained replicas of the dense variables (hybrid "
                    "mode): every worker that trained them is down; the parameter servers keep "
                    "their values from the start of this call. Restart the workers and resume "
                    "from the last checkpoint.")
            reply = source.client.call("resident_export", {"names": keys, "previous": False},
                                       stream=True)
            placement = {p.key: p.ps for v in self._resident.values() for p in v.placements}
            calls: dict[int, tuple[list[str], list[Any], list[np.ndarray]]] = defaultdict(
                lambda: ([], [], []))
            position = 0
            for key, state in zip(keys, reply.meta["shards"], strict=True):
                count = 1 + len(state["slots"])
                names, states, tensors = calls[placement[key]]
                names.append(key)
                states.append(state)
                tensors += reply.tensors[position:position + count]
                position += count
            self._strategy._ps.each({
                ps: server_checkpoints.call("import", {"names": names, "shards": states}, tensors)
                for ps, (names, states, tensors) in calls.items()})

    def drop(self, workers: Sequence[Any]) -> None:
        """Every worker forgets its replica (the parameter servers hold the values now)."""
        with self._lock:
            for worker in workers:
                if worker.resident and worker.alive and not worker.restarted:
                    worker.client.call("resident_clear", {"names": sorted(worker.resident)})
                worker.resident.clear()

    def end(self, workers: Sequence[Any]) -> None:
        """The end of a training call (``coordinator.join()``): flush, then drop."""
        self.flush(workers)
        self.drop(workers)


def hybrid_settings(mode: str, dense_variables: str | None,
                    max_staleness: int | None) -> dict[str, Any] | None:
    """The workers' hybrid-mode settings (``None``: every variable on the ps), from the
    arguments, else the ``sx.config`` options."""
    if dense_variables is None:
        dense_variables = config.ps_dense_variables
    if dense_variables not in ("ps", "workers"):
        raise ValueError(f"dense_variables={dense_variables!r}: use 'ps' (every variable on the "
                         "parameter servers) or 'workers' (hybrid mode).")
    if max_staleness is not None and (dense_variables != "workers" or mode != "async"):
        raise ValueError(
            f"max_staleness={max_staleness!r} bounds the asynchronous table updates of hybrid "
            f"mode; it needs dense_variables='workers' and mode='async', got "
            f"dense_variables={dense_variables!r}, mode={mode!r}.")
    if dense_variables == "ps":
        return None
    staleness = config.ps_max_staleness if max_staleness is None else max_staleness
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise ValueError(f"max_staleness must be an integer >= 0, got {staleness!r}.")
    return {"tables": mode, "max_staleness": staleness if mode == "async" else 0}


def require_tables(built: Program) -> None:
    """Hybrid mode is for models with tables read row-sparse: refuses a training step that
    reads none."""
    if built.meta["pushes"] and not built.meta["sparse"]:
        raise ValueError(
            "ParameterServerStrategy(dense_variables='workers') keeps the embedding tables read "
            "row-sparse on the parameter servers and replicates the rest, but this training "
            f"step reads no table by rows (it trains {len(built.meta['pushes'])} variables read "
            "whole). For a model without keras.layers.Embedding tables, use "
            "MultiWorkerMirroredStrategy (every variable replicated) or dense_variables='ps'.")
