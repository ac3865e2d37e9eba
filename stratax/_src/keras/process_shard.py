"""Each worker's share of ``fit``/``evaluate``/``predict`` data in a multi-process run.

TensorFlow's global-batch rule carried over: with ``P`` processes, global batch ``B`` and the data
in the same order on every worker, worker ``p`` feeds rows ``[k*B + p*B/P, k*B + (p+1)*B/P)`` of
step ``k`` (auto-shard by data), so the global batch of every step is exactly the one a single
process would see. The last, partial batch is split the same way when it divides over all
replicas and is otherwise fed whole by every worker (replicated, computed identically on every
replica), so no example is dropped and losses and metrics stay exact. ``predict`` feeds every
batch whole to every worker, so each worker gets all predictions.

Shuffling (``shuffle=True``) permutes the rows each epoch with a seed derived from the epoch
number, identically on every worker, so the workers still agree on each global batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import keras
import numpy as np
from keras.src.utils import rng_utils


def _rows(tree: Any) -> int:
    return int(jax.tree.leaves(tree)[0].shape[0])


class ProcessShard(keras.utils.PyDataset):
    """This process's batches of a global dataset (see the module docstring).

    ``arrays`` is a pytree of arrays cut into global batches of ``global_batch`` rows, or
    ``batches`` a sequence (``len`` and indexing, e.g. a ``PyDataset``) of global batches.
    """

    def __init__(self, arrays: Any = None, global_batch: int = 0, *, process_rank: int,
                 num_processes: int, num_replicas: int, batches: Any = None,
                 shuffle: bool = False, replicate_all: bool = False, seed: int = 0) -> None:
        super().__init__()
        self._arrays = None if arrays is None else jax.tree.map(np.asarray, arrays)
        self._batches = batches
        self._n = 0 if arrays is None else _rows(self._arrays)
        self._batch = global_batch
        self._rank = process_rank
        self._processes = num_processes
        self._replicas = num_replicas
        self._shuffle = shuffle and arrays is not None
        self._replicate_all = replicate_all
        self._seed = seed
        self._epoch = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self._shuffle:
            return np.arange(self._n)
        return np.random.default_rng((self._seed, epoch)).permutation(self._n)

    def start_epoch(self, epoch: int) -> None:
        """Makes the next ``local_batches`` call produce epoch ``epoch``'s order."""
        self._epoch = epoch
        self._order = self._permutation(epoch)

    def __len__(self) -> int:
        if self._batches is not None:
            return len(self._batches)
        return -(-self._n // self._batch)

    def _global_batch(self, index: int, order: np.ndarray) -> Any:
        if self._batches is not None:
            return self._batches[index]
        start = index * self._batch
        rows = order[start : min(start + self._batch, self._n)]
        return jax.tree.map(lambda a: a[rows], self._arrays)

    def _local(self, batch: Any) -> tuple[Any, bool]:
        rows = _rows(batch)
        if self._replicate_all or rows % self._replicas:
            return batch, True
        share = rows // self._processes
        return jax.tree.map(lambda a: np.asarray(a)[self._rank * share : (self._rank + 1) * share],
                            batch), False

    def __getitem__(self, index: int) -> Any:
        return self._local(self._global_batch(index, self._order))[0]

    def local_batches(self) -> Iterator[tuple[Any, bool]]:
        """One epoch of ``(batch, replicated)`` in order.

        Reaching the last batch advances to the next epoch's order (Keras stops asking after
        the last batch, so the generator never finishes); Keras' one-batch peek to build the
        model does not reach it.
        """
        count, order = len(self), self._order
        for index in range(count):
            if index == count - 1:
                self.start_epoch(self._epoch + 1)
            yield self._local(self._global_batch(index, order))


def _is_array_like(x: Any) -> bool:
    leaves = jax.tree.leaves(x)
    return bool(leaves) and all(isinstance(a, (np.ndarray, jax.Array)) for a in leaves)


def shard_arguments(arguments: dict[str, Any], method: str, *, process_rank: int,
                    num_processes: int, num_replicas: int) -> dict[str, Any]:
    """Rewrites bound ``fit``/``evaluate``/``predict`` arguments so arrays become a ``ProcessShard``."""
    x = arguments.get("x")
    common = {"process_rank": process_rank, "num_processes": num_processes,
              "num_replicas": num_replicas}
    if isinstance(x, keras.utils.PyDataset) and not isinstance(x, ProcessShard):
        if getattr(x, "per_worker", False) or not hasattr(x, "__len__"):
            return arguments
        return {**arguments, "x": ProcessShard(batches=x, replicate_all=method == "predict",
                                               **common)}
    if not _is_array_like(x):
        return arguments
    arguments = dict(arguments)
    batch = arguments.get("batch_size") or 32
    if method == "fit" and arguments.get("validation_split"):
        from keras.src.trainers.data_adapters import array_slicing

        (x, y, sw), validation = array_slicing.train_validation_split(
            (x, arguments.get("y"), arguments.get("sample_weight")),
            validation_split=arguments["validation_split"],
        )
        arguments.update(x=x, y=y, sample_weight=sw, validation_split=0.0,
                         validation_data=validation)
    packed = tuple(a for a in (arguments.get("x"), arguments.get("y"),
                               arguments.get("sample_weight")) if a is not None)
    if method == "predict":
        packed = (arguments["x"],)
    shuffle = bool(arguments.get("shuffle", method == "fit")) and method == "fit"
    seed = rng_utils.get_random_seed() or 0
    arguments["x"] = ProcessShard(packed, batch, shuffle=shuffle, seed=seed,
                                  replicate_all=method == "predict", **common)
    for name in ("y", "sample_weight", "batch_size"):
        if name in arguments:
            arguments[name] = None
    if method == "fit":
        arguments["shuffle"] = False  # the shard shuffles, identically on every worker
    validation = arguments.get("validation_data")
    if method == "fit" and isinstance(validation, (tuple, list)) and _is_array_like(validation):
        val_batch = arguments.get("validation_batch_size") or batch
        arguments["validation_data"] = ProcessShard(tuple(validation), val_batch, **common)
        arguments["validation_batch_size"] = None
    return arguments
