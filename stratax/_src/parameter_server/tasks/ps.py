"""The parameter-server task: holds variable shards (numpy) and applies optimizer updates.

No user code runs here: variables arrive as tensors or as recipes to build them from
(``shard_init``), the optimizer as a Keras config (JSON), gradients as tensors. Each push
carries a step id; a per-shard ledger of applied step ids makes a re-sent push (a re-run
closure, a retried call) a no-op, so every step is applied at most once per shard, and
``iterations`` counts exactly the updates applied.

A worker that dies while pushing a synchronous step may reach one ps and not another: the
first applies the step, the second waits for the re-run's gradient. So that the re-run
computes the gradient the dead worker computed, each shard keeps the values its last
synchronous step read (the rows pushed, or the whole shard) from before that step, and a pull
for that step id returns them.

Every request is validated completely before any state changes, so a malformed or inconsistent
request leaves the server as it was.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from typing import Any

import numpy as np

from stratax._src.parameter_server import shard_init
from stratax._src.parameter_server.tasks import checkpoint_methods, ownership
from stratax._src.parameter_server.tasks.optimizers import ShardOptimizer
from stratax._src.parameter_server.tasks.shards import (
    Shard,
    before_step,
    kept_before,
    summed,
    wait_applied,
)
from stratax._src.parameter_server.transport import rpc, wire

logger = logging.getLogger(__name__)


def _names(meta: dict[str, Any], key: str = "names") -> list[str]:
    names = wire.require(meta, key, list)
    if not all(isinstance(n, str) for n in names):
        raise wire.WireError(f"Field {key!r} must be a list of strings, got {names!r}.")
    return names


class ParameterServer(rpc.Dispatcher):
    """The state and request handler of one ``ps`` task (serve it with ``rpc_server.RpcServer``)."""

    shard_type = Shard  # what ``snapshots`` restores shards into

    def __init__(self, snapshots: Any = None) -> None:
        self._shards: dict[str, Shard] = {}
        # The digest (``ownership.session_digest``) of the chief session whose variables
        # this ps holds, restored with a snapshot, which stores the digest, never the id: a ps
        # restarted from another session's snapshot drops it when a new chief claims it.
        self.session_digest: str | None = None
        self._lock = threading.Lock()
        self.shutdown_requested = threading.Event()
        self._methods = {
            "ping": self._ping, "create": self._create, "build": self._build,
            "set_optimizer": self._set_optimizer,
            "pull": self._pull, "push": self._push,
            "assign": self._assign, "stats": self._stats, "shutdown": self._shutdown,
            "ledger": self._ledger,
            "export": lambda f: checkpoint_methods.export_shards(self, f),
            "import": lambda f: checkpoint_methods.import_shards(self, f),
            "save_shards": lambda f: checkpoint_methods.save_shards(self, f),
            "load_shards": lambda f: checkpoint_methods.load_shards(self, f),
        }
        if snapshots is not None:  # a ``snapshots.Snapshots``: restore, then snapshot pushes
            snapshots.attach(self)

    def reset(self) -> None:
        """Drops every variable shard (a new chief session took over from a quiet one)."""
        with self._lock:
            self._shards.clear()

    def adopt(self, meta: dict[str, Any]) -> None:
        """A chief claimed this ps: state from another session (a snapshot a restarted ps
        restored, written for a chief that is gone) is dropped, so the new chief starts from
        its own values or its checkpoint, as after a takeover."""
        session = meta.get("session")
        digest = ownership.session_digest(session) if isinstance(session, str) else None
        with self._lock:
            if (self.session_digest is not None and self._shards and (
                    digest is None or not hmac.compare_digest(self.session_digest, digest))):
                logger.warning("dropping %d shard(s) restored from another chief session: %s "
                               "claimed this ps", len(self._shards),
                               ownership.describe(session))
                self._shards.clear()
            self.session_digest = digest

    def _shard(self, name: str) -> Shard:
        shard = self._shards.get(name)
        if shard is None:
            raise KeyError(f"No variable shard named {name!r} on this parameter server.")
        return shard

    def _ping(self, frame: wire.Frame) -> bytes:
        return rpc.response({"shards": len(self._shards)})

    def _shutdown(self, frame: wire.Frame) -> bytes:
        self.shutdown_requested.set()
        return rpc.response()

    def _create(self, frame: wire.Frame) -> bytes:
        names = _names(frame.meta)
        if len(names) != len(frame.tensors):
            raise wire.WireError(f"create got {len(names)} names and {len(frame.tensors)} tensors.")
        self._store(names, frame.tensors)
        return rpc.response()

    def _build(self, frame: wire.Frame) -> bytes:
        """Builds the named shards here from a ``ShardRecipe``: the chief sends the recipe,
        the whole variable's shape and dtype, and each shard's first row and row count."""
        names = _names(frame.meta)
        starts = wire.require(frame.meta, "starts", list)
        rows = wire.require(frame.meta, "rows", list)
        shape = wire.require(frame.meta, "shape", list)
        try:
            recipe = shard_init.ShardRecipe.from_description(
                wire.require(frame.meta, "recipe", dict))
            dtype = np.dtype(wire.require(frame.meta, "dtype", str))
        except (TypeError, ValueError) as err:
            raise wire.WireError(f"build: {err}") from None
        if dtype.kind not in "fiu" or not (len(names) == len(starts) == len(rows)) or not all(
                isinstance(d, int) and d >= 0 for d in [*shape, *starts, *rows]):
            raise wire.WireError(f"build: names, starts and rows must align and shape, starts "
                                 f"and rows hold non-negative ints; dtype numeric, got "
                                 f"{names}, {starts}, {rows}, shape {shape}, dtype {dtype}.")
        try:
            values = [shard_init.build_rows(recipe, start, count, tuple(shape), dtype)
                      for start, count in zip(starts, rows, strict=True)]
        except ValueError as err:
            raise wire.WireError(f"build: {err}") from None
        self._store(names, values)
        return rpc.response()

    def _store(self, names: list[str], values: list[np.ndarray]) -> None:
        """Keeps ``values`` as the named shards; one that exists keeps its value, and must
        have the same shape and dtype."""
        with self._lock:
            for name, value in zip(names, values, strict=False):
                existing = self._shards.get(name)
                if existing is not None and (existing.value.shape != value.shape
                                             or existing.value.dtype != value.dtype):
                    raise ValueError(
                        f"Variable shard {name!r} exists with shape {existing.value.shape} "
                        f"{existing.value.dtype}, cannot re-create it as {value.shape} "
                        f"{value.dtype}."
                    )
            for name, value in zip(names, values, strict=False):
                if name not in self._shards:
                    # A streamed frame's tensors are writable views of its own buffer: keep
                    # them (no second copy of a large table); a unary frame's are copied.
                    kept = value.flags.writeable and value.flags.aligned
                    self._shards[name] = Shard(value if kept else np.array(value))

    def _set_optimizer(self, frame: wire.Frame) -> bytes:
        names = _names(frame.meta)
        spec = wire.require(frame.meta, "spec", dict)
        sparse = wire.require(frame.meta, "sparse_updates", str)
        key = json.dumps({"spec": spec, "sparse": sparse}, sort_keys=True)
        shards = [self._shard(n) for n in names]
        for name, shard in zip(names, shards, strict=False):
            if shard.optimizer is not None and shard.optimizer_key != key:
                raise ValueError(f"Variable shard {name!r} already has a different optimizer.")
        for shard in shards:
            with shard.lock:
                if shard.optimizer is None:
                    shard.optimizer = ShardOptimizer(spec, shard.value, sparse)
                    shard.optimizer_key = key
        return rpc.response()

    def _pull(self, frame: wire.Frame) -> bytes:
        """Whole shards named in ``names``, then the rows (one index tensor each) of the shards
        in ``row_names``; with ``after``, once that synchronous step is applied; with ``step``,
        the values that step read if it is the last one applied (a re-run)."""
        wanted = self._pull_plan(frame.meta, frame.tensors)
        after, deadline = self._after(frame.meta)
        step = frame.meta.get("step")
        if step is not None and not isinstance(step, str):
            raise wire.WireError(f"Field 'step' must be a step id string, got {step!r}.")
        return rpc.response({}, self._read(wanted, after, deadline, step))

    def _pull_plan(self, meta: dict[str, Any], tensors: list[np.ndarray]
                   ) -> list[tuple[str, Shard, np.ndarray | None]]:
        """Validates a pull request (``names``, ``row_names`` and one index tensor each)."""
        names = _names(meta)
        row_names = _names(meta, "row_names") if "row_names" in meta else []
        if len(row_names) != len(tensors):
            raise wire.WireError("pull needs one row-index tensor per name in 'row_names'.")
        wanted = [(n, self._shard(n), None) for n in names]
        wanted += [(n, self._shard(n), self._rows(n, self._shard(n), r))
                   for n, r in zip(row_names, tensors, strict=False)]
        return wanted

    def _read(self, wanted: list[tuple[str, Shard, np.ndarray | None]], after: str | None,
              deadline: float, step: str | None = None) -> list[np.ndarray]:
        values = []
        for name, shard, rows in wanted:
            with shard.lock:
                wait_applied(name, shard, after, deadline)
                if step is not None and shard.before is not None and shard.before[0] == step:
                    values.append(before_step(name, shard.before, rows))
                else:
                    values.append(shard.value.copy() if rows is None else shard.value[rows])
                if rows is None:
                    shard.whole_pulls += 1
                else:
                    shard.rows_pulled += int(rows.size)
        return values

    @staticmethod
    def _after(meta: dict[str, Any]) -> tuple[str | None, float]:
        after = meta.get("after")
        if after is not None and not isinstance(after, str):
            raise wire.WireError(f"Field 'after' must be a step id string, got {after!r}.")
        wait = meta.get("wait_s", 60.0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 3600:
            raise wire.WireError(f"Field 'wait_s' must be 0..3600 seconds, got {wait!r}.")
        return after, time.monotonic() + float(wait)

    @staticmethod
    def _rows(name: str, shard: Shard, rows: np.ndarray) -> np.ndarray:
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise wire.WireError(f"Row indices for {name!r} must be a 1-D integer tensor.")
        if rows.size and (rows.min() < 0 or rows.max() >= shard.value.shape[0]):
            raise wire.WireError(
                f"Row indices for {name!r} fall outside 0..{shard.value.shape[0] - 1}.")
        return rows.astype(np.int64)

    def _push(self, frame: wire.Frame) -> bytes:
        step = wire.require(frame.meta, "step", str)
        sync = frame.meta.get("sync", 1)
        worker = frame.meta.get("worker", 0)
        for key, value in (("sync", sync), ("worker", worker)):
            if type(value) is not int or not 0 <= value <= 1 << 16:
                raise wire.WireError(
                    f"Field {key!r} must be a small non-negative int, got {value!r}.")
        dense = _names(frame.meta, "dense")
        sparse = _names(frame.meta, "sparse")
        count = len(dense) + 2 * len(sparse)
        pull = frame.meta.get("pull")
        if pull is not None and (not isinstance(pull, dict) or sync > 1):
            raise wire.WireError(f"Field 'pull' must be an object (names, row_names) and only "
                                 f"on asynchronous pushes, got {pull!r} with sync={sync}.")
        if len(frame.tensors) < count or (pull is None and len(frame.tensors) != count):
            raise wire.WireError("push needs one gradient per dense name and (rows, grads) per "
                                 "sparse name.")
        # Asynchronous push-and-pull: the values read right after this update, in one call.
        wanted = self._pull_plan(pull, frame.tensors[count:]) if pull is not None else None
        updates = []
        for name, grad in zip(dense, frame.tensors, strict=False):
            shard = self._shard(name)
            if grad.shape != shard.value.shape:
                raise wire.WireError(f"Gradient for {name!r} has shape {grad.shape}, the variable "
                                     f"{shard.value.shape}.")
            updates.append((name, shard, None, grad))
        tail = frame.tensors[len(dense):count]
        for i, name in enumerate(sparse):
            shard = self._shard(name)
            rows, grad = self._rows(name, shard, tail[2 * i]), tail[2 * i + 1]
            if grad.shape != (rows.shape[0], *shard.value.shape[1:]):
                raise wire.WireError(f"Row gradient for {name!r} has shape {grad.shape}, "
                                     f"expected {(rows.shape[0], *shard.value.shape[1:])}.")
            if rows.size > 1 and not (rows[1:] > rows[:-1]).all():
                raise wire.WireError(
                    f"Row indices for {name!r} must be distinct and sorted in increasing order "
                    f"(as np.unique gives them), got {_excerpt(rows)}.")
            updates.append((name, shard, rows, grad))
        for name, shard, _, _ in updates:
            if shard.optimizer is None:
                raise RuntimeError(f"Variable shard {name!r} has no optimizer; call set_optimizer.")
        applied = 0
        for _, shard, rows, grad in updates:
            with shard.lock:
                if step in shard.ledger:
                    shard.duplicates += 1
                    continue
                if sync > 1:
                    heard, grads = shard.pending.setdefault(step, (set(), []))
                    if worker in heard:
                        shard.duplicates += 1
                        continue
                    heard.add(worker)
                    grads.append((rows, np.array(grad)))
                    if len(heard) < sync:
                        continue
                    del shard.pending[step]
                    rows, grad = summed(grads)
                    shard.before = kept_before(step, shard, rows)
                start = time.perf_counter()
                if rows is None:
                    shard.optimizer.apply_dense(shard.value, grad)
                else:
                    shard.optimizer.apply_rows(shard.value, rows, grad)
                shard.apply_seconds += time.perf_counter() - start
                shard.ledger.add(step)
                shard.lock.notify_all()
                applied += 1
        values = self._read(wanted, None, 0.0) if wanted is not None else []
        return rpc.response({"applied": applied, "skipped": len(updates) - applied}, values)

    def _assign(self, frame: wire.Frame) -> bytes:
        names = _names(frame.meta)
        if len(names) != len(frame.tensors):
            raise wire.WireError("assign needs one tensor per name.")
        pairs = [(self._shard(n), v) for n, v in zip(names, frame.tensors, strict=False)]
        for name, (shard, value) in zip(names, pairs, strict=False):
            if value.shape != shard.value.shape:
                raise wire.WireError(f"assign: {name!r} has shape {shard.value.shape}, got "
                                     f"{value.shape}.")
        for shard, value in pairs:
            with shard.lock:
                shard.value[...] = value
        return rpc.response()

    def _stats(self, frame: wire.Frame) -> bytes:
        names = _names(frame.meta)
        out = {}
        for name in names:
            shard = self._shard(name)
            with shard.lock:
                out[name] = {
                    "iterations": shard.optimizer.iterations if shard.optimizer else 0,
                    "applied_steps": len(shard.ledger), "duplicates": shard.duplicates,
                    "bytes": int(shard.value.nbytes), "apply_seconds": shard.apply_seconds,
                    "whole_pulls": shard.whole_pulls, "rows_pulled": shard.rows_pulled,
                }
        return rpc.response({"stats": out})

    def _ledger(self, frame: wire.Frame) -> bytes:
        """The step ids applied to each named shard (sorted), to audit exactly-once updates."""
        out = {}
        for name in _names(frame.meta):
            shard = self._shard(name)
            with shard.lock:
                out[name] = sorted(shard.ledger)
        return rpc.response({"ledger": out})


def _excerpt(rows: np.ndarray) -> str:
    """The first out-of-order place of ``rows`` for an error message."""
    bad = int(np.argmax(rows[1:] <= rows[:-1]))
    return f"rows[{bad}]={rows[bad]} then rows[{bad + 1}]={rows[bad + 1]} (of {rows.size})"
