"""Hybrid mode, on a worker: its replica of the dense variables and the exchange of their
gradients with the other workers.

Under ``ParameterServerStrategy(dense_variables="workers")`` only the embedding tables read
row-sparse stay on the parameter servers; every other variable a step reads (the dense towers,
BatchNorm statistics) is *resident*: each worker holds a replica, with its optimizer slots and
a ledger of applied step ids, in a ``ParameterServer`` of its own (the same shards, optimizer
rule and exactly-once ledger as a ps). A step's dense gradients are summed over the workers
(each worker gathers every other's contribution, in task order, so every replica applies the
same bits) and applied locally; the replicas stay identical as in MultiWorkerMirrored.

The exchange is pull-based and idempotent: a worker *posts* its contribution for a step id and
*fetches* the others' from their outboxes, which keep the last ``OUTBOX_STEPS`` steps.

A step on a worker: compute (from the replica and the tables' rows), post, fetch every other
worker's contribution, apply the sum to the replica, and only then push the tables' rows
(synchronous tables: the servers apply a step's rows once every worker pushed them). So when
the servers have applied step *s*, every replica has too, and the one step a replica may have
applied that the servers have not is its last. A worker restarted in the middle of a step gets
a live worker's replica, under the replica's lock: values, slots, the ledger of applied step
ids, and the values before its last step. Re-running the steps of the dead worker's closure, it
reads, for that last step, the values before it, and the servers still hold that step's rows
as they were (they wait for its push): it computes what the dead worker computed, bit for bit.
Steps in the ledger are neither exchanged nor applied again, and a re-sent row push is applied
once; so the run equals the one without the failure.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Any

import numpy as np

from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.recovery import MISSING_REPLICA, SYNC_WAIT, with_retries
from stratax._src.parameter_server.tasks import checkpoint_methods
from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.transport import rpc, wire

OUTBOX_STEPS = 16


class ResidentReplica:
    """One worker's replica of the resident variables and its side of the gradient exchange.

    Args:
      task_index: This worker's index.
      peer_addresses: Every worker's address, this one's included (index = task index).
      timeout: Seconds to wait for a peer's contribution (the chief's ``timeout_seconds``).
    """

    def __init__(self, task_index: int, peer_addresses: Sequence[str],
                 timeout: float = 60.0) -> None:
        self.task_index = task_index
        self.num_workers = len(peer_addresses)
        self.timeout = timeout
        self._store = ParameterServer()
        self._lock = threading.Lock()        # an update and a copy of the replica exclude
        # The last step applied and every shard's value before it: what a re-run of that step
        # reads (see the module docstring).
        self._previous: tuple[str, dict[str, np.ndarray]] | None = None
        self._outbox: collections.OrderedDict[str, list[np.ndarray]] = collections.OrderedDict()
        self._posted = threading.Condition()
        self._peers = {j: rpc.RpcClient(f"worker {j}", address, timeout)
                       for j, address in enumerate(peer_addresses) if j != task_index}
        self._pool = futures.ThreadPoolExecutor(max_workers=max(len(self._peers), 1),
                                                thread_name_prefix="stratax-exchange")

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for client in self._peers.values():
            client.close()

    def set_timeout(self, timeout: float) -> None:
        self.timeout = timeout
        for client in self._peers.values():
            client.timeout = timeout

    def set_session(self, session: str | None) -> None:
        """The chief session the exchange's calls to the other workers carry."""
        for client in self._peers.values():
            client.session = session

    def clear(self) -> None:
        """Drops the replica and the outbox (a new chief session took over)."""
        with self._lock:
            self._store.reset()
            self._previous = None
        with self._posted:
            self._outbox.clear()

    def drop(self, frame: wire.Frame) -> bytes:
        """Worker method ``resident_clear``: forgets the named shards (their strategy's chief
        ended a training call; another strategy of the session may hold others)."""
        names = wire.require(frame.meta, "names", list)
        with self._lock:
            for name in names:
                self._store._shards.pop(name, None)
                if self._previous is not None:
                    self._previous[1].pop(name, None)
        return rpc.response()

    # ----- the replica -----------------------------------------------------------------------
    def load(self, frame: wire.Frame) -> bytes:
        """Worker method ``resident_load``: takes shards (values, optimizer state, ledger) as
        ``resident_export`` or a ps' ``export`` gives them, replacing what it holds."""
        names = wire.require(frame.meta, "names", list)
        ledgers = frame.meta.get("ledgers") or [[] for _ in names]
        states = wire.require(frame.meta, "shards", list)
        if len(ledgers) != len(names) or len(states) != len(names):
            raise wire.WireError(f"resident_load got {len(names)} names, {len(states)} states "
                                 f"and {len(ledgers)} ledgers.")
        previous = frame.meta.get("previous")
        if previous is not None and not isinstance(previous, str):
            raise wire.WireError(f"Field 'previous' must be a step id, got {previous!r}.")
        values, position = [], 0
        for state in states:
            values.append(frame.tensors[position])
            position += 1 + len(wire.require(state, "slots", list))
        before = frame.tensors[position:]
        if len(before) != (len(names) if previous is not None else 0):
            raise wire.WireError(f"resident_load with previous step {previous!r} needs one "
                                 f"value per name before it, got {len(before)}.")
        with self._lock:
            for name in names:
                self._store._shards.pop(name, None)
            self._store.handle(wire.Frame({"method": "create", "names": names}, values))
            self._store.handle(wire.Frame({"method": "import", "names": names,
                                           "shards": states}, frame.tensors[:position]))
            for name, ledger in zip(names, ledgers, strict=True):
                self._store._shard(name).ledger = set(ledger)
            self._previous = None if previous is None else (
                previous, {n: np.array(v) for n, v in zip(names, before, strict=True)})
        return rpc.response()

    def export(self, frame: wire.Frame) -> bytes:
        """Worker method ``resident_export``: the named shards as the ps' ``export`` gives
        them, plus each one's ledger of applied step ids and, unless ``previous`` is false
        (a copy back to the servers needs none), the values before the last step."""
        names = wire.require(frame.meta, "names", list)
        with self._lock:
            self._require(names)
            reply = wire.decode(checkpoint_methods.export_shards(self._store, frame))
            ledgers = [sorted(self._store._shard(n).ledger) for n in names]
            previous, before = None, []
            if (frame.meta.get("previous", True) and self._previous is not None
                    and all(n in self._previous[1] for n in names)):
                previous, before = self._previous[0], [self._previous[1][n] for n in names]
        return rpc.response({"shards": reply.meta["shards"], "ledgers": ledgers,
                             "previous": previous}, [*reply.tensors, *before])

    def read(self, variables: Sequence[dict[str, Any]], step: str) -> list[np.ndarray]:
        """The replica's values of ``variables`` (descriptions), whole, for step ``step``: the
        values before it when it is the last step applied (a re-run), else the current ones."""
        with self._lock:
            self._require([s[1] for var in variables for s in var["shards"]])
            before = self._previous[1] if self._previous and self._previous[0] == step else {}
            values = []
            for var in variables:
                parts = [before[key].copy() if key in before else
                         self._store._shard(key).value.copy() for _, key, _, _ in var["shards"]]
                values.append(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0))
        return values

    def applied(self, step: str, variables: Sequence[dict[str, Any]]) -> bool:
        keys = [s[1] for var in variables for s in var["shards"]]
        with self._lock:
            self._require(keys)
            return all(step in self._store._shard(key).ledger for key in keys)

    def update(self, step: str, trained: Sequence[dict[str, Any]], grads: Sequence[np.ndarray],
               assigned: Sequence[dict[str, Any]], values: Sequence[np.ndarray]) -> None:
        """Applies step ``step`` once: the summed gradients of ``trained`` (the optimizer's
        rule, as a ps applies it) and the new values of ``assigned``."""
        keys, tensors = [], []
        for var, grad in zip(trained, grads, strict=True):
            for _, key, start, count in var["shards"]:
                keys.append(key)
                tensors.append(grad[start:start + count] if len(var["shards"]) > 1 else grad)
        with self._lock:
            if keys and all(step in self._store._shard(k).ledger for k in keys):
                return
            self._previous = (step, {key: shard.value.copy()
                                     for key, shard in self._store._shards.items()})
            self._store.handle(wire.Frame({"method": "push", "step": step, "dense": keys,
                                           "sparse": [], "sync": 1,
                                           "worker": self.task_index}, tensors))
            for var, value in zip(assigned, values, strict=True):
                for _, key, start, count in var["shards"]:
                    part = value[start:start + count] if len(var["shards"]) > 1 else value
                    self._store._shard(key).value[...] = part

    def _require(self, keys: Sequence[str]) -> None:
        missing = [k for k in keys if k not in self._store._shards]
        if missing:
            raise KeyError(f"{MISSING_REPLICA} {missing[0]!r} on worker {self.task_index} (of "
                           f"{len(missing)} missing); the chief sends the replica first.")

    # ----- the exchange ----------------------------------------------------------------------
    def contribution(self, frame: wire.Frame) -> bytes:
        """Worker method ``contribution``: this worker's tensors for step ``step``, once
        posted (waiting up to ``wait_s``)."""
        step = wire.require(frame.meta, "step", str)
        wait = frame.meta.get("wait_s", 0.0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 3600:
            raise wire.WireError(f"Field 'wait_s' must be 0..3600 seconds, got {wait!r}.")
        deadline = time.monotonic() + float(wait)
        with self._posted:
            while step not in self._outbox:
                left = deadline - time.monotonic()
                if left <= 0 or not self._posted.wait(left):
                    raise TimeoutError(f"Worker {self.task_index} has not computed step {step} "
                                       f"within {wait:g} s.")
            tensors = self._outbox[step]
        return rpc.response({}, tensors)

    def exchange(self, step: str, tensors: list[np.ndarray]) -> list[list[np.ndarray]]:
        """Posts this worker's ``tensors`` for ``step`` and returns every worker's, in task
        order. A peer that does not answer within ``timeout`` raises ``TimeoutError`` (which
        the chief's recovery takes as a survivor's share to run again)."""
        with self._posted:
            self._outbox[step] = tensors
            self._outbox.move_to_end(step)
            while len(self._outbox) > OUTBOX_STEPS:
                self._outbox.popitem(last=False)
            self._posted.notify_all()
        pending = {j: self._pool.submit(self._fetch, client, step)
                   for j, client in self._peers.items()}
        got = {self.task_index: tensors}
        for j, future in pending.items():
            got[j] = future.result()
        return [got[j] for j in range(self.num_workers)]

    def _fetch(self, client: rpc.RpcClient, step: str) -> list[np.ndarray]:
        deadline = time.monotonic() + self.timeout

        def call() -> list[np.ndarray]:
            left = max(deadline - time.monotonic(), 0.1)
            return client.call("contribution", {"step": step, "wait_s": 0.8 * left},
                               timeout=left).tensors

        try:
            return with_retries(call, client.name, self.timeout)
        except (WorkerUnavailableError, rpc.RemoteError) as err:
            if isinstance(err, rpc.RemoteError) and "has not computed" not in str(err):
                raise
            raise TimeoutError(
                f"Synchronous step {step} of the dense variables is {SYNC_WAIT} from "
                f"{client.name} at {client.address} after {self.timeout:g} s: a worker may "
                f"have died ({err}).") from None


def summed(contributions: list[list[np.ndarray]], count: int) -> list[np.ndarray]:
    """The sum over workers (task order) of the first ``count`` tensors of each."""
    return [np.sum(np.stack([c[i] for c in contributions]), axis=0) for i in range(count)]


def averaged(contributions: list[list[np.ndarray]], start: int) -> list[np.ndarray]:
    """Each tensor from ``start`` on, over workers: the mean of floating values (BatchNorm
    statistics), the first worker's of others (seeds, counters: equal on every worker)."""
    out = []
    for i in range(start, len(contributions[0])):
        first = contributions[0][i]
        if np.issubdtype(first.dtype, np.floating):
            out.append((np.sum(np.stack([c[i] for c in contributions]), axis=0)
                        / len(contributions)).astype(first.dtype))
        else:
            out.append(first)
    return out
