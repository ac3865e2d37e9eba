"""Client side of the parameter servers: pull, pull rows, push, grouped per ps and in parallel.

Variables are given as their JSON descriptions (``PSVariable.describe()``): name, shape, dtype
and shards ``[ps, key, start, rows]``. One call per ps per operation; calls to different ps run
concurrently.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import numpy as np

from stratax._src.parameter_server import recovery
from stratax._src.parameter_server.transport import rpc

VarDesc = dict[str, Any]
# A push: (variable, distinct global rows or None for dense, gradient).
Push = tuple[VarDesc, "np.ndarray | None", np.ndarray]


class PSClients:
    """One ``RpcClient`` per parameter server, plus the grouped operations workers need."""

    def __init__(self, addresses: Sequence[str], timeout: float = 60.0) -> None:
        self.addresses = list(addresses)
        self.timeout = timeout
        self.clients = [rpc.RpcClient(f"ps {i}", a, timeout) for i, a in enumerate(addresses)]
        self._pool = futures.ThreadPoolExecutor(max_workers=max(len(addresses), 1),
                                                thread_name_prefix="stratax-ps")

    def set_timeout(self, timeout: float) -> None:
        """The deadline of each call and how long a ps that does not answer is retried."""
        self.timeout = timeout
        for client in self.clients:
            client.timeout = timeout

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for client in self.clients:
            client.close()

    def each(self, calls: dict[int, Callable[[rpc.RpcClient], Any]]) -> dict[int, Any]:
        """Runs ``calls[ps](client)`` for each ps concurrently; returns results by ps. A ps
        that does not answer is retried with backoff for up to ``timeout`` seconds (a ps
        restarting from its snapshot; a repeated push is applied once)."""
        calls = {ps: self._retrying(call, self.clients[ps]) for ps, call in calls.items()}
        if len(calls) <= 1:
            return {ps: call() for ps, call in calls.items()}
        pending = {ps: self._pool.submit(call) for ps, call in calls.items()}
        return {ps: future.result() for ps, future in pending.items()}

    def _retrying(self, call: Callable[[rpc.RpcClient], Any],
                  client: rpc.RpcClient) -> Callable[[], Any]:
        return lambda: recovery.with_retries(lambda: call(client), client.name, self.timeout)

    def pull(self, variables: Sequence[VarDesc], rows: Sequence[np.ndarray | None] | None = None,
             after: str | None = None, session: str | None = None,
             step: str | None = None) -> list[np.ndarray]:
        """Values of ``variables``, one call per ps: whole (shards concatenated along axis 0)
        where ``rows[i]`` is None, else ``var[rows[i]]`` for sorted distinct global rows. With
        ``after``, once synchronous step ``after`` is applied to each shard. ``step``: the
        synchronous step the values are read for (a shard that already applied it, for a
        re-run, gives what it read). ``session``: the chief session whose closure makes the
        call (see ``tasks.ownership``)."""
        plan = _PullPlan(variables, rows)

        def pull_from(ps: int) -> Callable[[rpc.RpcClient], list[np.ndarray]]:
            meta = {**plan.meta(ps), "after": after, **_session(session),
                    **({"step": step} if step is not None else {}),
                    "wait_s": 0.8 * self.timeout}  # the ps gives up before the call deadline
            big = plan.nbytes[ps] > rpc.CHUNK_BYTES
            return lambda c: c.call("pull", meta, plan.local[ps], stream=big).tensors

        return plan.assemble(self.each({ps: pull_from(ps) for ps in plan.targets()}))

    def push(self, step: str, pushes: Sequence[Push], sync: int = 1, worker: int = 0,
             pull: tuple[Sequence[VarDesc], Sequence[np.ndarray | None]] | None = None,
             session: str | None = None) -> list[np.ndarray] | None:
        """Sends gradients; each ps applies step ``step`` to each of its shards at most once.

        With ``sync`` > 1 the ps sums the gradients of ``sync`` distinct workers for the step
        and applies them as one update when the last arrives.

        With ``pull=(variables, rows)`` (asynchronous mode) each ps also returns, in the same
        call, those variables' values read right after applying this push (as ``pull`` would:
        one round trip per ps instead of two); the values are returned.
        """
        if pull is not None and sync > 1:
            raise ValueError("push(pull=...) is for asynchronous steps; a synchronous step pulls "
                             "once every worker's gradient is applied (pull(after=...)).")
        dense: dict[int, list[str]] = defaultdict(list)
        dense_t: dict[int, list[np.ndarray]] = defaultdict(list)
        sparse: dict[int, list[str]] = defaultdict(list)
        sparse_t: dict[int, list[np.ndarray]] = defaultdict(list)
        for var, rows, grad in pushes:
            for ps, key, start, count in var["shards"]:
                if rows is None:
                    dense[ps].append(key)
                    dense_t[ps].append(
                        grad[start:start + count] if len(var["shards"]) > 1 else grad)
                    continue
                if len(var["shards"]) == 1:
                    sparse[ps].append(key)
                    sparse_t[ps].extend([rows, grad])
                    continue
                mask = (rows >= start) & (rows < start + count)
                # A synchronous step is applied once every worker pushed, rows or none.
                if mask.any() or sync > 1:
                    sparse[ps].append(key)
                    sparse_t[ps].extend([rows[mask] - start, grad[mask]])
        plan = _PullPlan(*pull) if pull is not None else None
        targets = set(dense) | set(sparse) | (plan.targets() if plan else set())

        def push_to(ps: int) -> Callable[[rpc.RpcClient], Any]:
            meta = {"step": step, "dense": dense[ps], "sparse": sparse[ps], "sync": sync,
                    "worker": worker, **_session(session)}
            tensors = dense_t[ps] + sparse_t[ps]
            if plan is None:
                return lambda c: c.call("push", meta, tensors)
            meta["pull"] = plan.meta(ps)
            big = plan.nbytes[ps] > rpc.CHUNK_BYTES
            return lambda c: c.call("push", meta, tensors + plan.local[ps], stream=big).tensors

        got = self.each({ps: push_to(ps) for ps in targets})
        return plan.assemble(got) if plan is not None else None

    def assign(self, variables: Sequence[VarDesc], values: Sequence[np.ndarray],
               session: str | None = None) -> None:
        """Writes new values (each shard its block of rows), one call per ps."""
        names: dict[int, list[str]] = defaultdict(list)
        parts: dict[int, list[np.ndarray]] = defaultdict(list)
        for var, value in zip(variables, values, strict=True):
            for ps, key, start, count in var["shards"]:
                names[ps].append(key)
                parts[ps].append(value[start:start + count] if len(var["shards"]) > 1 else value)

        def assign_on(ps: int) -> Callable[[rpc.RpcClient], Any]:
            return lambda c: c.call("assign", {"names": names[ps], **_session(session)},
                                    parts[ps])

        self.each({ps: assign_on(ps) for ps in names})


class _PullPlan:
    """Which shards (whole) and which rows of which shards to read from each ps, and how to
    put the replies back together into one value per variable."""

    def __init__(self, variables: Sequence[VarDesc],
                 rows: Sequence[np.ndarray | None] | None) -> None:
        rows = list(rows) if rows is not None else [None] * len(variables)
        self.whole: dict[int, list[str]] = defaultdict(list)
        self.sliced: dict[int, list[str]] = defaultdict(list)
        self.local: dict[int, list[np.ndarray]] = defaultdict(list)
        self.nbytes: dict[int, int] = defaultdict(int)
        self.plan = []
        for var, wanted in zip(variables, rows, strict=True):
            pieces = []
            for ps, key, start, count in var["shards"]:
                if wanted is None:
                    self.whole[ps].append(key)
                    self.nbytes[ps] += _row_bytes(var) * max(count, 1)
                    pieces.append((ps, False, len(self.whole[ps]) - 1, None))
                    continue
                mask = (None if len(var["shards"]) == 1
                        else (wanted >= start) & (wanted < start + count))
                if mask is not None and not mask.any():
                    continue
                chosen = wanted if mask is None else wanted[mask] - start
                self.sliced[ps].append(key)
                self.local[ps].append(chosen)
                self.nbytes[ps] += chosen.size * _row_bytes(var)
                pieces.append((ps, True, len(self.sliced[ps]) - 1, mask))
            self.plan.append((var, wanted, pieces))

    def targets(self) -> set[int]:
        return set(self.whole) | set(self.sliced)

    def meta(self, ps: int) -> dict[str, Any]:
        return {"names": self.whole[ps], "row_names": self.sliced[ps]}

    def assemble(self, got: dict[int, list[np.ndarray]]) -> list[np.ndarray]:
        values = []
        whole = self.whole
        for var, wanted, pieces in self.plan:
            parts = [got[ps][len(whole[ps]) + i if is_rows else i] for ps, is_rows, i, _ in pieces]
            if wanted is None:
                values.append(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0))
            elif len(pieces) == 1 and pieces[0][3] is None:
                values.append(parts[0])
            else:
                out = np.empty((wanted.size, *tuple(var["shape"][1:])), np.dtype(var["dtype"]))
                for (_, _, _, mask), part in zip(pieces, parts, strict=False):
                    out[mask] = part
                values.append(out)
        return values


def _session(session: str | None) -> dict[str, str]:
    """The ``session`` field of a call made for a chief's closure (none: no field)."""
    return {"session": session} if session else {}


def _row_bytes(var: VarDesc) -> int:
    return math.prod(var["shape"][1:]) * np.dtype(var["dtype"]).itemsize

