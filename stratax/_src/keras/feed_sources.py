"""Where a feed's global batches come from (``keras.feed``): arrays, indexed sequences, one-shot
iterators and re-iterable inputs, each in the ``(seed, epoch)`` order ``keras.feed`` describes.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import keras
import numpy as np

from stratax._src import seam
from stratax._src.keras.feed_layout import FeedLayout, batch_rows


def _standardize(batch: Any) -> Any:
    """A batch as Keras' ``PyDataset`` adapter reads it: a dict or an ``(x[, y[, w]])`` tuple."""
    if isinstance(batch, (np.ndarray, jax.Array)):
        return (batch,)
    if isinstance(batch, list):
        return tuple(batch)
    return batch


def _with_class_weight(batch: Any, class_weight: dict[int, float] | None) -> Any:
    if class_weight is None:
        return batch
    if not isinstance(batch, tuple) or len(batch) != 2:
        raise ValueError(
            "class_weight needs batches of (x, y); received batches with "
            f"{len(batch) if isinstance(batch, tuple) else type(batch).__name__} parts. Give "
            "per-example weights as the third element of each batch instead."
        )
    return (*batch, seam.class_weight_to_sample_weights(batch[1], class_weight))


def _permutation(size: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng((seed, epoch)).permutation(size)


class ArraySource:
    """Global batches cut from arrays, in a ``(seed, epoch)`` order when shuffled."""

    def __init__(self, arrays: Any, batch_size: int, shuffle: bool | str) -> None:
        self.arrays = jax.tree.map(np.asarray, arrays)
        self._n = batch_rows(self.arrays)
        self._batch = batch_size
        self._shuffle = shuffle
        self._rows: np.ndarray | None = None

    def __len__(self) -> int:
        return -(-self._n // self._batch)

    @property
    def num_batches(self) -> int:
        return len(self)

    def split(self) -> tuple[Any, ArraySource]:
        """``(arrays, source)``: the arrays, and a source of the same batches' row indices
        ``(rows,)`` in the same order (for runners whose workers hold the arrays)."""
        return self.arrays, ArraySource((np.arange(self._n),), self._batch, self._shuffle)

    def batches(self, seed: int, epoch: int, skip: int) -> Iterator[Any]:
        for rows in self._row_indices(seed, epoch, skip):
            yield jax.tree.map(lambda a, r=rows: a[r], self.arrays)

    def local_batches(self, seed: int, epoch: int, skip: int,
                      layout: FeedLayout) -> Iterator[tuple[Any, bool]]:
        """``GlobalFeed.local_batches`` for arrays: each process gathers only its own rows of
        every global batch (half the copying of 2 processes cutting whole batches)."""
        for rows in self._row_indices(seed, epoch, skip):
            count = len(rows) if isinstance(rows, np.ndarray) else rows.stop - rows.start
            share = layout.share(count)
            if share is not None and layout.num_shares > 1:
                rows = (slice(rows.start + share.start, rows.start + share.stop)
                        if isinstance(rows, slice) else rows[share])
            yield jax.tree.map(lambda a, r=rows: a[r], self.arrays), share is None

    def row_pass(self, seed: int, epoch: int, skip: int) -> RowPass:
        """The pass of epoch ``epoch`` from batch ``skip``, by rows (:class:`RowPass`)."""
        return RowPass(self.arrays, self._order(seed, epoch), self._batch, skip)

    def _order(self, seed: int, epoch: int) -> np.ndarray:
        """Every row, in the order of epoch ``epoch``'s batches. Unshuffled, the very same
        array every epoch, so that a runner that placed it once sees at a glance that it has
        not changed."""
        if self._rows is None:
            self._rows = np.arange(self._n, dtype=np.int64 if self._n >= 2**31 else np.int32)
        if self._shuffle is True:
            return self._rows[_permutation(self._n, seed, epoch)]
        if self._shuffle == "batch":
            return np.concatenate([self._rows[r] for r in self._row_indices(seed, epoch, 0)])
        return self._rows

    def _row_indices(self, seed: int, epoch: int, skip: int) -> Iterator[Any]:
        """Each global batch's rows (a slice, or indices when shuffled), from batch ``skip``."""
        order = _permutation(self._n, seed, epoch) if self._shuffle is True else None
        for index in range(skip, len(self)):
            start, stop = index * self._batch, min((index + 1) * self._batch, self._n)
            if order is not None:
                yield order[start:stop]
            elif self._shuffle == "batch":
                yield start + np.random.default_rng((seed, epoch, index)).permutation(stop - start)
            else:
                yield slice(start, stop)


@dataclasses.dataclass(frozen=True)
class RowPass:
    """One pass over a feed cut from arrays, named by rows: batch ``i`` (from ``first`` on) is
    rows ``order[i * batch_size:][:batch_size]`` of ``arrays`` (the last one may be shorter)."""

    arrays: Any
    order: np.ndarray
    batch_size: int
    first: int

    def spans(self) -> Iterator[tuple[int, int]]:
        """``(start, rows)`` of each batch of the pass, in ``order``."""
        for start in range(self.first * self.batch_size, len(self.order), self.batch_size):
            yield start, min(self.batch_size, len(self.order) - start)

    def batch(self, start: int, rows: int) -> Any:
        """The batch of ``rows`` rows from ``start``, cut on the host."""
        return jax.tree.map(lambda a: a[self.order[start:start + rows]], self.arrays)


class SequenceSource:
    """Batches read by index (a ``PyDataset`` or a list), the batch order shuffled per epoch."""

    def __init__(self, sequence: Any, shuffle: bool, class_weight: dict[int, float] | None) -> None:
        self.sequence = sequence
        self._shuffle = bool(shuffle)
        self._class_weight = class_weight

    def __len__(self) -> int:
        size = getattr(self.sequence, "num_batches", None)
        return len(self.sequence) if size is None else int(size)

    @property
    def num_batches(self) -> int:
        return len(self)

    def batches(self, seed: int, epoch: int, skip: int) -> Iterator[Any]:
        order = _permutation(len(self), seed, epoch) if self._shuffle else range(len(self))
        indices = [int(i) for i in itertools.islice(order, skip, None)]
        read = (_read_by_workers(self.sequence, indices) if _has_workers(self.sequence)
                else (self.sequence[i] for i in indices))
        for batch in read:
            yield _with_class_weight(_standardize(batch), self._class_weight)


def _has_workers(sequence: Any) -> bool:
    """Keras' rule for a ``PyDataset`` read by a pool: ``workers > 1``, or processes asked for."""
    if not isinstance(sequence, keras.utils.PyDataset):
        return False
    workers = sequence.workers
    return workers > 1 or (workers > 0 and sequence.use_multiprocessing)


class _InOrder(keras.utils.PyDataset):
    """``dataset[indices[i]]`` as batch ``i``: the order stratax chose, for Keras' pool."""

    def __init__(self, dataset: keras.utils.PyDataset, indices: list[int]) -> None:
        super().__init__(workers=dataset.workers, use_multiprocessing=dataset.use_multiprocessing,
                         max_queue_size=dataset.max_queue_size)
        self._dataset, self._indices = dataset, indices

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: int) -> Any:
        return self._dataset[self._indices[index]]


def _read_by_workers(dataset: keras.utils.PyDataset, indices: list[int]) -> Iterator[Any]:
    """``dataset[i]`` for ``i`` in ``indices``, read ahead by the dataset's ``workers`` threads
    (processes with ``use_multiprocessing``), as plain Keras reads it, in this order."""
    if not indices:
        return
    enqueuer = seam.ordered_enqueuer(_InOrder(dataset, indices), dataset.workers,
                                     dataset.use_multiprocessing, dataset.max_queue_size,
                                     name=type(dataset).__name__)
    enqueuer.start()
    try:
        yield from itertools.islice(enqueuer.get(), len(indices))
    finally:
        enqueuer.stop()


class IterableSource:
    """Batches of a one-shot iterator read once, in order (a generator is not re-run per
    epoch)."""

    num_batches = None

    def __init__(self, iterable: Iterable[Any], class_weight: dict[int, float] | None) -> None:
        self._iterator = iter(iterable)
        self._class_weight = class_weight
        self._pushed_back: list[Any] = []

    def peek(self) -> Any:
        """The next batch, left in place for the next pass."""
        if not self._pushed_back:
            self._pushed_back.append(next(self._iterator))
        return _with_class_weight(_standardize(self._pushed_back[0]), self._class_weight)

    def batches(self, seed: int, epoch: int, skip: int) -> Iterator[Any]:
        del seed
        pending, self._pushed_back = self._pushed_back, []
        read = 0
        for batch in itertools.islice(itertools.chain(pending, self._iterator), skip, None):
            read += 1
            yield _with_class_weight(_standardize(batch), self._class_weight)
        if not read and not skip:
            warnings.warn(
                f"Epoch {epoch} reads no batch: the {type(self._iterator).__name__} given as "
                "input was used up by an earlier epoch (an iterator is read once, as Keras "
                "reads it). Pass a re-iterable input (a tf.data or grain dataset, a "
                "keras.utils.PyDataset, an object whose __iter__ starts a new pass), or an "
                "endless generator with steps_per_epoch.", UserWarning, stacklevel=2)


class PassSource:
    """Batches of a re-iterable input, one fresh pass per epoch, in the input's own order.

    ``new_pass()`` starts a pass: Keras' data adapter's ``get_numpy_iterator`` for ``tf.data``,
    grain and torch ``DataLoader``\\ s (so each is read exactly as Keras reads it), or
    ``iter(x)`` of any other re-iterable object (its leaves converted to numpy).
    """

    def __init__(self, new_pass: Callable[[], Iterable[Any]], num_batches: int | None,
                 class_weight: dict[int, float] | None = None) -> None:
        self._new_pass = new_pass
        self.num_batches = num_batches
        self._class_weight = class_weight

    def batches(self, seed: int, epoch: int, skip: int) -> Iterator[Any]:
        del seed, epoch
        for batch in itertools.islice(iter(self._new_pass()), skip, None):
            batch = jax.tree.map(_as_numpy, _standardize(batch))
            yield _with_class_weight(batch, self._class_weight)


def _as_numpy(leaf: Any) -> Any:
    return leaf if isinstance(leaf, (np.ndarray, jax.Array)) else np.asarray(leaf)

