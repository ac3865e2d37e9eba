"""A ps task's variable shard (``ps``'s docstring says why each part is kept): its value and
optimizer, the ledger of applied step ids, and the synchronous mode's parts: gradients summed
from every worker, the wait for a step to be applied, and what a step read, for its re-run.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import numpy as np

from stratax._src.parameter_server.tasks.optimizers import ShardOptimizer


@dataclasses.dataclass
class Shard:
    """One variable shard as this task holds it: its value, optimizer, the ledger of applied
    step ids, counters, and (synchronous mode) the steps waiting for gradients."""

    value: np.ndarray
    lock: threading.Condition = dataclasses.field(default_factory=threading.Condition)
    optimizer: ShardOptimizer | None = None
    optimizer_key: str = ""
    ledger: set[str] = dataclasses.field(default_factory=set)
    duplicates: int = 0
    apply_seconds: float = 0.0
    whole_pulls: int = 0  # pulls of the whole shard
    rows_pulled: int = 0  # rows sent by row pulls (the row-sparse path)
    # Synchronous mode: step id -> (workers heard from, gradients received so far).
    pending: dict[str, tuple[set[int], list[tuple[Any, np.ndarray]]]] = dataclasses.field(
        default_factory=dict)
    # Synchronous mode: (step id, rows or None for the whole shard, their values before it)
    # of the last step applied, what a re-run of that step reads (see ``ps``'s docstring).
    before: tuple[str, np.ndarray | None, np.ndarray] | None = None


def wait_applied(name: str, shard: Shard, step: str | None, deadline: float) -> None:
    """Synchronous mode: waits (lock held) until step ``step`` is applied to the shard."""
    while step is not None and step in shard.pending:
        left = deadline - time.monotonic()
        heard = sorted(shard.pending[step][0])
        if left <= 0 or not shard.lock.wait(left):
            raise TimeoutError(
                f"Synchronous step {step} of {name!r} is still waiting for gradients: heard "
                f"from worker(s) {heard} only; a worker may have died."
            )


def kept_before(step: str, shard: Shard, rows: np.ndarray | None
                ) -> tuple[str, np.ndarray | None, np.ndarray]:
    """What synchronous step ``step`` read of ``shard`` (its pushed ``rows``, or the whole
    shard), before it is applied; the whole shard's buffer is reused from step to step."""
    if rows is not None:
        return step, rows, shard.value[rows]
    kept = shard.before
    buffer = (kept[2] if kept is not None and kept[1] is None
              else np.empty_like(shard.value))
    np.copyto(buffer, shard.value)
    return step, None, buffer


def before_step(name: str, before: tuple[str, np.ndarray | None, np.ndarray],
                rows: np.ndarray | None) -> np.ndarray:
    """The values of ``rows`` (None: the whole shard) before the last synchronous step, for a
    re-run of that step, which reads what the step read."""
    step, kept_rows, values = before
    if kept_rows is None:
        return values.copy() if rows is None else values[rows]
    at = np.searchsorted(kept_rows, rows) if rows is not None else None
    if at is None or (at.size and (at.max() >= kept_rows.size
                                   or not (kept_rows[at] == rows).all())):
        raise RuntimeError(
            f"A re-run of synchronous step {step} reads rows of {name!r} that the step did not "
            "push; the step's values cannot be read again. This is a bug in the worker's step.")
    return values[at]


def summed(grads: list[tuple[Any, np.ndarray]]) -> tuple[Any, np.ndarray]:
    """The sum of every worker's gradient for one synchronous step (dense, or row-sparse with
    the union of the rows)."""
    if grads[0][0] is None:
        return None, np.sum([g for _, g in grads], axis=0)
    rows = np.concatenate([r for r, _ in grads])
    unique, inverse = np.unique(rows, return_inverse=True)
    total = np.zeros((unique.size, *grads[0][1].shape[1:]), grads[0][1].dtype)
    np.add.at(total, inverse, np.concatenate([g for _, g in grads]))
    return unique, total
