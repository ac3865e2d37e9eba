"""Distributed datasets: iterate global batches as ``PerReplica`` values on the replicas' devices.

``experimental_distribute_dataset`` takes any iterable of *global* batches (numpy or JAX arrays,
or tuples/dicts of them, e.g. a generator, a list or a ``keras.utils.PyDataset``) and splits each
batch over all replicas in order, with the one policy of ``global_batch``: replica ``i`` gets the
``i``-th chunk of ``ceil(rows / num_replicas_in_sync)`` rows; a short last batch leaves the last
replicas fewer or no rows, padded with zeros and recorded in ``PerReplica.valid_rows``. In a
multi-process run each process contributes the rows of its own replicas (auto-shard by data) or
its own part read from its own files or shard (``data.sharding``: ``tf.data``'s ``FILE`` and
``OFF`` policies, a sharded grain loader).

``distribute_datasets_from_function`` calls the user's function once per process with an
``InputContext``; its dataset yields *per-replica* batches, and each step takes one batch per
local replica. A trailing step with fewer batches than replicas is kept (the missing replicas get
empty batches), as in TensorFlow; it is never dropped.

Processes whose pipelines differ (``AutoShardPolicy.OFF``, ``distribute_datasets_from_function``)
agree on every step's row counts with one small all-gather, so that a process that runs out of
data first still joins the steps of the others with empty batches (TensorFlow does the same).

Batches are produced by a ``Prefetcher`` thread ``experimental_prefetch_to_device`` steps ahead,
and placed on the devices there when ``experimental_fetch_to_device`` is True.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src.data import global_batch, sharding
from stratax._src.data.input_context import InputContext, InputOptions
from stratax._src.data.prefetch import Prefetcher
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


def _as_array(leaf: Any) -> np.ndarray | jax.Array:
    array = leaf if isinstance(leaf, (jax.Array, np.ndarray)) else np.asarray(leaf)
    if array.ndim == 0:
        raise ValueError(
            "A batch element is a scalar; distributed batches need a leading batch axis."
        )
    return array


def _rows(tree: Any, what: str) -> int:
    """The common row count of a batch's leaves (a clear error if they disagree)."""
    leaves = jax.tree.leaves(tree)
    counts = sorted({int(_as_array(leaf).shape[0]) for leaf in leaves})
    if len(counts) != 1:
        raise ValueError(
            f"The arrays of {what} have different batch sizes {counts} along axis 0; every "
            "element of a batch (inputs, labels, weights) needs one row per example."
        )
    return counts[0]


@dataclasses.dataclass(frozen=True)
class _Step:
    """This process's part of one step: a pytree of ``(local_replicas, rows, ...)`` host blocks.

    ``counts`` are the real rows of every replica of the mesh once known (always for global
    batches; after the processes agree for per-process pipelines); ``local_counts`` are this
    process's replicas' real rows.
    """

    blocks: Any
    local_counts: list[int]
    counts: tuple[int, ...] | None = None


class _Placement:
    """Where one process's share of a batch goes: the mesh, its replicas, the sharding."""

    def __init__(self, mesh: Mesh, static_shapes: bool = False) -> None:
        self.static_shapes = static_shapes
        # One device per replica: a ("replica", "core") mesh's replica spans a row of cores.
        rows = mesh.devices.reshape(mesh.devices.shape[0], -1)
        spanning = len({d.process_index for d in rows[0]})
        if spanning > 1:
            raise ValueError(
                f"Each replica's {rows.shape[1]} cores span {spanning} workers "
                f"(cores_per_replica larger than a worker's devices): a distributed dataset "
                "for a custom loop cannot feed such replicas yet. Train with model.fit, which "
                "does, or use a cores_per_replica that divides each worker's device count."
            )
        devices = list(rows[:, 0])
        self.num_replicas = len(devices)
        self.local_replicas = local_replica_ids(devices)
        self.sharding = NamedSharding(mesh, P(_REPLICA_AXIS))
        self.process_rank, self.num_processes = process_rank(devices)
        processes = sorted({d.process_index for d in devices})
        self.replicas_of_process = [
            [i for i, d in enumerate(devices) if d.process_index == p] for p in processes
        ]

    def place(self, block: Any) -> jax.Array:
        """Places this process's ``(num_local_replicas, rows, ...)`` block as one global array."""
        global_shape = (self.num_replicas, *block.shape[1:])
        return jax.make_array_from_process_local_data(self.sharding, block, global_shape)

    def agree(self, local_counts: list[int] | None) -> tuple[int, ...] | None:
        """Every replica's real rows of this step, or ``None`` when no process has data left.

        One all-gather of a few integers between the processes (a collective: every process
        calls it once per step, in the same order).
        """
        width = max(len(r) for r in self.replicas_of_process)
        mine = np.zeros(1 + width, np.int32)
        if local_counts is not None:
            mine[0] = 1
            mine[1 : 1 + len(local_counts)] = local_counts
        table = np.asarray(multihost_utils.process_allgather(mine))
        if not table[:, 0].any():
            return None
        counts = [0] * self.num_replicas
        for row, replicas in zip(table, self.replicas_of_process, strict=True):
            for k, replica in enumerate(replicas):
                counts[replica] = int(row[1 + k])
        return tuple(counts)


def _finish(step: _Step, counts: tuple[int, ...], padded: int, placement: _Placement,
            to_device: bool) -> Any:
    """The ``PerReplica`` batch of a step, given every replica's real rows: padded to
    ``padded`` rows per replica, placed."""

    def leaf(block: np.ndarray | jax.Array) -> PerReplica:
        if block.shape[1] < padded:
            block = np.stack([global_batch.pad_rows(np.asarray(b), padded) for b in block])
        return PerReplica(placement.place(block) if to_device else np.asarray(block), counts)

    return jax.tree.map(leaf, step.blocks)


def _split_global(batch: Any, placement: _Placement, by_caller: bool) -> _Step:
    """Cuts one batch into this process's per-replica blocks (see ``global_batch``).

    ``by_caller``: the batch is already this process's share (``AutoShardPolicy.OFF`` with
    several processes); it is cut over the local replicas and the counts are agreed later.
    """
    rows = _rows(batch, "a batch")
    local = len(placement.local_replicas)
    if by_caller:
        blocks = jax.tree.map(lambda a: global_batch.split_and_pad(_as_array(a), local), batch)
        return _Step(blocks, global_batch.split_sizes(rows, local))
    first, last = placement.local_replicas[0], placement.local_replicas[-1] + 1
    blocks = jax.tree.map(
        lambda a: global_batch.split_and_pad(_as_array(a), placement.num_replicas)[first:last],
        batch,
    )
    counts = tuple(global_batch.split_sizes(rows, placement.num_replicas))
    return _Step(blocks, list(counts[first:last]), counts)


def _stack_parts(parts: list[Any], placement: _Placement, template: Any, index: int) -> _Step:
    """One step of ``distribute_datasets_from_function``: one batch per local replica.

    Replicas past the end of the data get an empty batch shaped like ``template``.
    """
    local = len(placement.local_replicas)
    empty = jax.tree.map(lambda a: np.zeros((0, *np.shape(a)[1:]), np.asarray(a).dtype), template)
    parts = parts + [empty] * (local - len(parts))
    rows = [_rows(p, f"the batch of local replica {k} in step {index}")
            for k, p in enumerate(parts)]

    def stack(*leaves: Any) -> np.ndarray:
        stacked, _ = global_batch.stack_padded(
            [np.asarray(_as_array(x)) for x in leaves],
            what=f"the per-replica batches of step {index}",
        )
        return stacked

    blocks = jax.tree.map(stack, *parts)
    counts = tuple(rows) if placement.num_processes == 1 else None
    return _Step(blocks, rows, counts)


class DistributedIterator:
    """Iterator over ``PerReplica`` batches, produced ahead of use by a ``Prefetcher`` thread."""

    def __init__(self, produce: Iterator[Any], options: InputOptions,
                 finish: Callable[[Iterator[Any]], Iterator[Any]] | None = None) -> None:
        self._prefetcher = Prefetcher(produce, options.experimental_prefetch_to_device)
        self._items = finish(self._prefetcher) if finish is not None else self._prefetcher

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        return next(self._items)

    def get_next(self) -> Any:
        """The next batch (TensorFlow's spelling); raises ``StopIteration`` at the end."""
        return next(self)

    def get_next_as_optional(self) -> Any | None:
        """The next batch, or ``None`` at the end of the data."""
        try:
            return next(self)
        except StopIteration:
            return None

    def close(self) -> None:
        """Stops the background producer (also done at the end of the data and on deletion)."""
        self._prefetcher.close()


def _iterate(steps: Iterator[_Step], placement: _Placement, options: InputOptions,
             agreed: bool) -> DistributedIterator:
    """Runs ``steps`` ahead in a thread; ``agreed`` steps are finished (padded, placed) there too.

    Steps that still need the processes' agreement are finished in the consumer's thread, so
    that the agreement collective runs in the same order on every process.
    """
    to_device = options.experimental_fetch_to_device
    widest = 0

    def finished(step: _Step, counts: tuple[int, ...]) -> Any:
        # Static shapes (TPUStrategy): a short batch is padded to the widest one before it,
        # so that one compiled program serves the whole epoch.
        nonlocal widest
        widest = max(widest, *counts) if placement.static_shapes else max(counts)
        return _finish(step, counts, widest, placement, to_device)

    if agreed:
        return DistributedIterator((finished(s, s.counts or (0,)) for s in steps), options)

    def finish(produced: Iterator[_Step]) -> Iterator[Any]:
        template: _Step | None = None
        for_each = iter(produced)
        while True:
            step = next(for_each, None)
            counts = placement.agree(None if step is None else step.local_counts)
            if counts is None:
                return
            if step is None:
                step = _empty_like(template, placement)
            template = step
            yield finished(step, counts)

    return DistributedIterator(steps, options, finish)


def _empty_like(template: _Step | None, placement: _Placement) -> _Step:
    if template is None:
        raise ValueError(
            f"Process {placement.process_rank} has no batch at all while other processes still "
            "have data; give every input pipeline at least one batch (shard the data so that "
            "each worker gets some)."
        )
    blocks = jax.tree.map(lambda b: np.zeros((b.shape[0], 0, *b.shape[2:]), b.dtype),
                          template.blocks)
    return _Step(blocks, [0] * len(placement.local_replicas))


class DistributedDataset:
    """An iterable of ``PerReplica`` batches made from a dataset of global batches.

    Created by ``strategy.experimental_distribute_dataset(dataset)``; each iteration re-iterates
    the underlying dataset (one epoch). A short last batch is split as TensorFlow splits it and
    padded (see ``docs/uneven_batches.md``).

    Example:
        >>> dist = strategy.experimental_distribute_dataset(batches)     # doctest: +SKIP
        >>> for x, y in dist:                                            # doctest: +SKIP
        ...     losses = strategy.run(step, args=(x, y))
    """

    def __init__(self, dataset: Any, mesh: Mesh, options: InputOptions | None = None,
                 static_shapes: bool = False) -> None:
        self._dataset = dataset
        self._placement = _Placement(mesh, static_shapes)
        self._options = options or InputOptions()

    @property
    def dataset(self) -> Any:
        """The dataset of global batches this was made from."""
        return self._dataset

    @property
    def options(self) -> InputOptions:
        return self._options

    def __iter__(self) -> DistributedIterator:
        placement = self._placement
        dataset, by_caller = sharding.shard_for_process(
            self._dataset, self._options.auto_shard_policy, placement.num_processes,
            placement.process_rank)
        steps = (_split_global(batch, placement, by_caller) for batch in iterate_batches(dataset))
        return _iterate(steps, placement, self._options, agreed=not by_caller)


class DistributedDatasetsFromFunction:
    """The ``PerReplica`` batches of ``distribute_datasets_from_function``, one pipeline each."""

    def __init__(
        self,
        dataset_fn: Callable[[InputContext], Any],
        mesh: Mesh,
        options: InputOptions | None = None,
        static_shapes: bool = False,
    ) -> None:
        self._placement = _Placement(mesh, static_shapes)
        self._options = options or InputOptions()
        context = InputContext(
            num_input_pipelines=self._placement.num_processes,
            input_pipeline_id=self._placement.process_rank,
            num_replicas_in_sync=self._placement.num_replicas,
        )
        self._dataset = dataset_fn(context)

    @property
    def options(self) -> InputOptions:
        return self._options

    @property
    def reiterable(self) -> bool:
        """Whether each pass reads the pipeline anew (``dataset_fn`` returned a dataset, not a
        one-shot iterator such as a generator, which passes share)."""
        return not isinstance(self._dataset, Iterator)

    def __iter__(self) -> DistributedIterator:
        placement = self._placement
        steps = (_stack_parts(parts, placement, parts[0], index)
                 for index, parts in enumerate(self._steps()))
        return _iterate(steps, placement, self._options, agreed=placement.num_processes == 1)

    def local_global_batches(self) -> Iterator[Any]:
        """This process's share of each step as one batch: its replicas' batches concatenated.

        A trailing step with fewer batches than local replicas is yielded too (smaller).
        """
        for step in self._steps():
            yield jax.tree.map(lambda *parts: np.concatenate([np.asarray(p) for p in parts]),
                               *step)

    def _steps(self) -> Iterator[list[Any]]:
        """The per-replica batches of each step: one per local replica (fewer at the end)."""
        per_step = len(self._placement.local_replicas)
        pending: list[Any] = []
        for batch in iterate_batches(self._dataset):
            pending.append(batch)
            if len(pending) == per_step:
                yield pending
                pending = []
        if pending:
            yield pending
