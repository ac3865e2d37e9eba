"""Arrays shipped once to every worker, whose batches a scheduled closure names by row indices.

``model.fit(x=arrays, ...)`` under ``ParameterServerStrategy``: the chief sends the (packed)
arrays to each worker once, as raw tensors over the wire (no pickle), the first time a closure
of that worker uses them; each closure then carries only the row indices of its batches (a few
KB), cut and shuffled on the chief exactly as ``keras.feed``'s ``GlobalFeed`` cuts them. A
closure re-run on another worker after a failure therefore reads exactly the same examples,
which is what makes ``evaluate`` visit each example once.

Chief side: :class:`ArrayData` (``batch(rows)`` inside a function given to ``schedule``).
Worker side: :class:`ArrayStore` (the ``arrays``/``drop_arrays`` requests and ``run``'s rows).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from stratax._src.parameter_server.closures import LeafRef, recording
from stratax._src.parameter_server.inputs.per_worker_dataset import MIXED_SOURCES
from stratax._src.parameter_server.transport import structure

_names = itertools.count()


class ArrayData:
    """Arrays held by every worker; ``batch(rows)`` gives placeholders for ``arrays[rows]``.

    Created by ``array_data(coordinator, tree)``; the coordinator ships ``leaves`` to a
    worker before the first closure that reads them runs there (again after a worker restarts).

    Example:
      >>> data = array_data(coordinator, (x, y))                          # doctest: +SKIP
      >>> def step_fn():                                                  # doctest: +SKIP
      ...     return strategy.run(replica_fn, args=data.batch(np.arange(32)))
    """

    def __init__(self, tree: Any, shares: int = 1) -> None:
        leaves = [np.ascontiguousarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]
        if not leaves:
            raise ValueError(f"No arrays to ship to the workers in {tree!r}.")
        rows = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
        if len(rows) != 1 or None in rows:
            raise ValueError(f"Every array needs the same number of rows (axis 0); got shapes "
                             f"{[leaf.shape for leaf in leaves]}.")
        self.name = f"arrays{next(_names)}"
        self.shares = shares  # synchronous mode: worker i takes part i of ``shares`` of a batch
        self.num_rows = int(leaves[0].shape[0])
        self.structure, self.leaves = structure.describe(tree)
        self.leaves = leaves

    def batch(self, rows: Any) -> Any:
        """Inside a scheduled function: placeholders for the batch ``arrays[rows]`` (the worker
        cuts it). A closure reads one ArrayData (and no iterator); each call is one more
        batch."""
        closure = recording()
        if closure.iterators or (closure.data is not None and closure.data is not self):
            raise ValueError(MIXED_SOURCES)
        rows = np.asarray(rows)
        if rows.ndim != 1 or rows.dtype.kind not in "iu" or not rows.size:
            raise ValueError(f"Batch rows must be a non-empty 1-D integer array, got {rows!r}.")
        if rows.min() < 0 or rows.max() >= self.num_rows:
            raise IndexError(f"Batch rows fall outside 0..{self.num_rows - 1}.")
        if rows.size % self.shares:
            raise ValueError(
                f"A batch of {rows.size} rows does not split over the {self.shares} workers of a "
                "synchronous step (each takes an equal share); use a batch size and a number of "
                f"examples that are multiples of {self.shares}, or set steps_per_epoch to skip "
                "the last partial batch.")
        closure.data = self
        closure.rows.append(rows.astype(np.int64))
        index = closure.batches
        closure.batches += 1
        share = rows.size // self.shares
        refs = [LeafRef(index, i, jax.ShapeDtypeStruct((share, *leaf.shape[1:]),
                                                               leaf.dtype))
                for i, leaf in enumerate(self.leaves)]
        return structure.build(self.structure, refs)


class ArrayStore:
    """A worker's arrays by name, and the batches that closures name by rows."""

    def __init__(self) -> None:
        self._sets: dict[str, list[np.ndarray]] = {}

    def put(self, name: str, tensors: Sequence[np.ndarray]) -> None:
        """Stores ``tensors`` (same number of rows each) under ``name``."""
        rows = {t.shape[0] if t.ndim else None for t in tensors}
        if not tensors or len(rows) != 1 or None in rows:
            raise ValueError(f"Arrays {name!r} need >= 1 tensor, all with the same rows; got "
                             f"{[t.shape for t in tensors]}.")
        self._sets[name] = [np.array(t) for t in tensors]

    def drop(self, name: str) -> None:
        """Forgets ``name`` (nothing happens if it is unknown)."""
        self._sets.pop(name, None)

    def batches(self, name: str, rows: Sequence[np.ndarray], part: int = 0,
                parts: int = 1) -> list[list[np.ndarray]]:
        """``[[array[r] for array in arrays(name)] for r in rows]``, each ``r`` checked; with
        ``parts`` > 1 (a synchronous step), only part ``part`` of each ``r``."""
        arrays = self._sets.get(name)
        if arrays is None:
            raise KeyError(f"No arrays {name!r} on this worker; the coordinator ships them "
                           "before the first closure that reads them.")
        size = arrays[0].shape[0]
        out = []
        for r in rows:
            if r.ndim != 1 or r.dtype.kind not in "iu" or (r.size and (r.min() < 0
                                                                        or r.max() >= size)):
                raise ValueError(f"Rows of {name!r} must be 1-D integers in 0..{size - 1}.")
            if not 0 <= part < parts or r.size % parts:
                raise ValueError(f"{r.size} rows do not split into {parts} equal parts (part "
                                 f"{part} asked).")
            share = r.size // parts
            r = r[part * share:(part + 1) * share]
            out.append([a[r] for a in arrays])
        return out


def array_data(coordinator: Any, tree: Any) -> ArrayData:
    """Arrays every worker of ``coordinator`` receives once (raw tensors, when a closure first
    reads them); ``data.batch(rows)`` inside a scheduled function names a batch by its rows."""
    return ArrayData(tree, shares=coordinator.data_shares())
