"""Distributed datasets: iterate global batches as ``PerReplica`` values on the replicas' devices.

``experimental_distribute_dataset`` takes any iterable of *global* batches (numpy or JAX arrays,
or tuples/dicts of them, e.g. a generator, a list or a ``keras.utils.PyDataset``) and splits each
batch over all replicas in order: replica ``i`` gets rows ``[i*b, (i+1)*b)`` with
``b = global_batch // num_replicas_in_sync``. In a multi-process run each process contributes the
rows of its own replicas (auto-shard by data) or, with ``AutoShardPolicy.OFF``, the caller gives
each process its own share already.

``distribute_datasets_from_function`` calls the user's function once per process with an
``InputContext``; its dataset yields *per-replica* batches, and each step takes one batch per
local replica.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src.data.input_context import AutoShardPolicy, InputContext, InputOptions
from stratax._src.data.values import PerReplica
from stratax._src.runtime.devices import local_replica_ids, process_rank

_REPLICA_AXIS = "replica"


def iterate_batches(dataset: Any) -> Iterator[Any]:
    """Iterates a Python iterable, or a sequence such as ``keras.utils.PyDataset`` by index."""
    if hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__") and not isinstance(
        dataset, (list, tuple)
    ):
        for index in range(len(dataset)):
            yield dataset[index]
        return
    if not isinstance(dataset, Iterable):
        raise TypeError(
            f"Cannot distribute {type(dataset).__name__}: pass an iterable of batches (a "
            "generator, a list of (x, y) tuples, a keras.utils.PyDataset, ...)."
        )
    yield from dataset


class _Placement:
    """Where one process's share of a batch goes: the mesh, this process's replicas, the sharding."""

    def __init__(self, mesh: Mesh) -> None:
        # One device per replica: a ("replica", "core") mesh's replica spans a row of cores.
        devices = list(mesh.devices.reshape(mesh.devices.shape[0], -1)[:, 0])
        self.num_replicas = len(devices)
        self.local_replicas = local_replica_ids(devices)
        self.sharding = NamedSharding(mesh, P(_REPLICA_AXIS))
        self.process_rank, self.num_processes = process_rank(devices)

    def stack(self, local_rows: np.ndarray | jax.Array) -> PerReplica:
        """Places this process's ``(num_local_replicas, per_replica, ...)`` block as a PerReplica."""
        global_shape = (self.num_replicas, *local_rows.shape[1:])
        return PerReplica(
            jax.make_array_from_process_local_data(self.sharding, local_rows, global_shape)
        )


def _as_array(leaf: Any) -> np.ndarray | jax.Array:
    return leaf if isinstance(leaf, (jax.Array, np.ndarray)) else np.asarray(leaf)


def split_global_batch(batch: Any, placement: _Placement, policy: AutoShardPolicy) -> Any:
    """Splits one global batch (a pytree of arrays) into ``PerReplica`` leaves."""

    def split(leaf: Any) -> PerReplica:
        array = _as_array(leaf)
        if array.ndim == 0:
            raise ValueError(
                "A batch element is a scalar; distributed batches need a leading batch axis."
            )
        sharded_by_caller = policy is AutoShardPolicy.OFF and placement.num_processes > 1
        rows = array.shape[0]
        replicas = len(placement.local_replicas) if sharded_by_caller else placement.num_replicas
        if rows % replicas:
            raise ValueError(
                f"A batch of {rows} examples does not split over {replicas} replicas; use a "
                f"global batch size that is a multiple of {replicas} (drop or pad the last "
                f"partial batch, e.g. `drop_remainder=True`)."
            )
        per_replica = rows // replicas
        stacked = array.reshape(replicas, per_replica, *array.shape[1:])
        if not sharded_by_caller:
            stacked = stacked[placement.local_replicas[0] : placement.local_replicas[-1] + 1]
        return placement.stack(stacked)

    return jax.tree.map(split, batch)


def stack_per_replica_batches(batches: list[Any], placement: _Placement) -> Any:
    """Stacks one per-replica batch per local replica into ``PerReplica`` leaves."""

    def stack(*leaves: Any) -> PerReplica:
        arrays = [_as_array(leaf) for leaf in leaves]
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            raise ValueError(
                f"Per-replica batches of one step have different shapes {sorted(shapes)}; every "
                "replica needs the same per-replica batch size (drop the last partial batch)."
            )
        return placement.stack(np.stack([np.asarray(a) for a in arrays]))

    return jax.tree.map(stack, *batches)


class DistributedIterator:
    """Iterator over ``PerReplica`` batches with a small look-ahead of device transfers."""

    def __init__(self, produce: Iterator[Any], prefetch: int) -> None:
        self._produce = produce
        self._buffer: collections.deque[Any] = collections.deque()
        self._prefetch = max(prefetch, 0)

    def __iter__(self) -> "DistributedIterator":
        return self

    def __next__(self) -> Any:
        while len(self._buffer) <= self._prefetch:
            try:
                self._buffer.append(next(self._produce))
            except StopIteration:
                break
        if not self._buffer:
            raise StopIteration
        return self._buffer.popleft()

    def get_next(self) -> Any:
        """The next batch (TensorFlow's spelling); raises ``StopIteration`` at the end."""
        return next(self)

    def get_next_as_optional(self) -> Any | None:
        """The next batch, or ``None`` at the end of the data."""
        try:
            return next(self)
        except StopIteration:
            return None


class DistributedDataset:
    """An iterable of ``PerReplica`` batches made from a dataset of global batches.

    Created by ``strategy.experimental_distribute_dataset(dataset)``; each iteration re-iterates
    the underlying dataset (one epoch).

    Example:
        >>> dist = strategy.experimental_distribute_dataset(batches)     # doctest: +SKIP
        >>> for x, y in dist:                                            # doctest: +SKIP
        ...     losses = strategy.run(step, args=(x, y))
    """

    def __init__(self, dataset: Any, mesh: Mesh, options: InputOptions | None = None) -> None:
        self._dataset = dataset
        self._placement = _Placement(mesh)
        self._options = options or InputOptions()

    @property
    def dataset(self) -> Any:
        """The dataset of global batches this was made from."""
        return self._dataset

    @property
    def options(self) -> InputOptions:
        return self._options

    def __iter__(self) -> DistributedIterator:
        policy = self._options.auto_shard_policy
        produce = (
            split_global_batch(batch, self._placement, policy)
            for batch in iterate_batches(self._dataset)
        )
        return DistributedIterator(produce, self._options.experimental_prefetch_to_device)


class DistributedDatasetsFromFunction:
    """The ``PerReplica`` batches of ``distribute_datasets_from_function``: one pipeline per process."""

    def __init__(
        self,
        dataset_fn: Callable[[InputContext], Any],
        mesh: Mesh,
        options: InputOptions | None = None,
    ) -> None:
        self._placement = _Placement(mesh)
        self._options = options or InputOptions()
        context = InputContext(
            num_input_pipelines=self._placement.num_processes,
            input_pipeline_id=self._placement.process_rank,
            num_replicas_in_sync=self._placement.num_replicas,
        )
        self._dataset = dataset_fn(context)

    def __iter__(self) -> DistributedIterator:
        produce = (stack_per_replica_batches(step, self._placement) for step in self._steps())
        return DistributedIterator(produce, self._options.experimental_prefetch_to_device)

    def local_global_batches(self) -> Iterator[Any]:
        """This process's share of each step as one batch: its replicas' batches concatenated."""
        for step in self._steps():
            yield jax.tree.map(lambda *parts: np.concatenate([np.asarray(p) for p in parts]),
                               *step)

    def _steps(self) -> Iterator[list[Any]]:
        """The per-replica batches of each step: one per local replica."""
        per_step = len(self._placement.local_replicas)
        pending: list[Any] = []
        for batch in iterate_batches(self._dataset):
            pending.append(batch)
            if len(pending) == per_step:
                yield pending
                pending = []
