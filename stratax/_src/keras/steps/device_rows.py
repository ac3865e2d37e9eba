"""Array input kept on the devices: ``fit``'s batches named by their rows, gathered in the step.

Cut on the host, every batch of ``model.fit(x, y)`` is copied into a fresh device buffer by a
placement of its own, one per array and step; on CPU that costs as much as a quarter of a
small model's step, and between processes pinned one core each it takes the core the step
needs (``benchmarks/HISTORY.md``, "Arrays kept on the devices"). So when ``fit`` gets arrays
(the same on every worker) that fit :func:`budget`, the runner places them on its
devices once per call and each epoch's row order once per epoch; a batch is then a
:class:`RowBatch` (the placed arrays, the order, where the batch starts in it), and the compiled
step gathers the rows itself, each replica its own share. The batches, their order and their
split over replicas are the host path's (``keras.feed``), so training computes the same values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Sharding

from stratax._src.core.config import config
from stratax._src.keras.feed_layout import FeedLayout
from stratax._src.keras.feed_sources import RowPass
from stratax._src.strategies.replica_context import REPLICA_AXIS

# On CPU the devices' memory is the host's: a second copy of the input is cheap there.
_CPU_BUDGET = 1 << 30


@dataclasses.dataclass(frozen=True)
class RowBatch:
    """A batch of ``size`` rows: rows ``order[start:start + size]`` of ``arrays`` (all placed)."""

    arrays: Any
    order: jax.Array
    start: Any
    size: int


jax.tree_util.register_dataclass(RowBatch, data_fields=["arrays", "order", "start"],
                                 meta_fields=["size"])


@dataclasses.dataclass(frozen=True)
class RowGroup:
    """Batches of ``size`` rows of the same ``arrays`` in the same ``order``, one per start
    (placed scalars): a group of :class:`RowBatch`es passed to a program as one."""

    arrays: Any
    order: jax.Array
    starts: tuple[Any, ...]
    size: int

    @classmethod
    def of(cls, batches: list[Any]) -> RowGroup | None:
        """``batches`` as one group, or ``None`` unless all are :class:`RowBatch`es of the
        same arrays, order and size."""
        first = batches[0]
        if not isinstance(first, RowBatch) or not all(
                isinstance(batch, RowBatch) and batch.arrays is first.arrays
                and batch.order is first.order and batch.size == first.size
                for batch in batches):
            return None
        return cls(first.arrays, first.order, tuple(batch.start for batch in batches),
                   first.size)

    def batch(self, start: Any) -> RowBatch:
        """The group's batch that starts at ``start`` (one of :attr:`starts`, or one of them
        traced)."""
        return RowBatch(self.arrays, self.order, start, self.size)


jax.tree_util.register_dataclass(RowGroup, data_fields=["arrays", "order", "starts"],
                                 meta_fields=["size"])


def _gather(batch: RowBatch, first: Any, size: int) -> Any:
    rows = jax.lax.dynamic_slice_in_dim(batch.order, first, size)
    return jax.tree.map(lambda a: jnp.take(a, rows, axis=0, mode="clip"), batch.arrays)


def whole_batch(data: Any) -> Any:
    """``data`` itself, or the rows a :class:`RowBatch` names (inside a traced step)."""
    if not isinstance(data, RowBatch):
        return data
    return _gather(data, data.start, data.size)


def replica_batch(data: Any, num_replicas: int) -> Any:
    """This replica's share of ``data`` (inside ``shard_map`` over ``"replica"``): ``data``
    itself, or the rows of a :class:`RowBatch` that fall to this replica."""
    if not isinstance(data, RowBatch):
        return data
    size = data.size // num_replicas
    return _gather(data, data.start + jax.lax.axis_index(REPLICA_AXIS) * size, size)


def budget(devices: Any) -> int:
    """Option ``resident_array_bytes`` (``STRATAX_RESIDENT_ARRAY_BYTES``): the most bytes of
    array input ``fit`` keeps on a process's devices, counted once per device (0 = never).
    Default: 1 GiB on CPU; 0 on accelerators, whose memory the model needs (there the
    placement ahead of the step hides the copy)."""
    default = _CPU_BUDGET if all(d.platform == "cpu" for d in devices) else 0
    return config.get("resident_array_bytes", default=default)


def fits(arrays: Any, devices: Any) -> bool:
    """Whether ``arrays`` kept once on each of ``devices`` stay within the budget."""
    size = sum(jax.dtypes.canonicalize_dtype(np.asarray(a).dtype).itemsize * np.size(a)
               for a in jax.tree.leaves(arrays))
    return 0 < size * len(devices) <= budget(devices)


class Resident:
    """A ``fit`` call's arrays placed with ``sharding`` (replicated), and the passes over them."""

    def __init__(self, arrays: Any, sharding: Sharding) -> None:
        self._sharding = sharding
        self.arrays = jax.tree.map(self._place, arrays)
        self._order: tuple[np.ndarray, jax.Array] | None = None
        # Batch starts placed once: a Python int would be placed by every step's dispatch,
        # on jit's slow path between processes, and ``jax.device_put`` checks a value placed
        # over processes with an all-gather (docs/design/performance.md has the costs).
        self._starts: dict[int, jax.Array] = {}

    def _place(self, array: Any) -> jax.Array:
        return jax.make_array_from_process_local_data(self._sharding, np.asarray(array))

    def batches(self, rows: RowPass, layout: FeedLayout) -> Iterator[RowBatch | Any]:
        """The pass's batches: a :class:`RowBatch` for each batch that splits over the
        replicas, the host-cut batch itself for one that does not (fed whole to each)."""
        order = self._placed_order(rows.order)
        for start, size in rows.spans():
            if layout.share(size) is None:
                yield rows.batch(start, size)
                continue
            if start not in self._starts:
                self._starts[start] = self._place(np.int32(start))
            yield RowBatch(self.arrays, order, self._starts[start], size)

    def _placed_order(self, order: np.ndarray) -> jax.Array:
        """``order`` placed, once per distinct order (an unshuffled fit places it once)."""
        if self._order is None or not (self._order[0] is order
                                       or np.array_equal(self._order[0], order)):
            self._order = (order, self._place(order))
        return self._order[1]
