"""Turns the inputs TensorFlow users pass to ``fit`` into inputs Keras 3 accepts.

- numpy/JAX arrays, ``keras.utils.PyDataset`` and generators go to Keras unchanged (a generator
  is consumed once, as in Keras: pass ``steps_per_epoch`` and repeat it for several epochs);
- a list or tuple of ``(x, y[, sample_weight])`` or dict batches becomes a ``PyDataset``, so each
  epoch sees every batch again;
- a stratax ``DistributedDataset`` gives back the global batches it was made from (or, with
  ``AutoShardPolicy.OFF``, the batches each worker already reads for itself);
- ``distribute_datasets_from_function``'s datasets become a generator of this process's
  batches (its replicas' per-replica batches concatenated), consumed like any generator.
"""

from __future__ import annotations

from typing import Any

import keras

from stratax._src.data.input_context import AutoShardPolicy
from stratax._src.data.distributed_dataset import (
    DistributedDataset,
    DistributedDatasetsFromFunction,
)


class BatchList(keras.utils.PyDataset):
    """A list of batches as a ``PyDataset`` (re-iterated every epoch).

    ``per_worker`` marks batches that are already this worker's share (``AutoShardPolicy.OFF``).
    """

    def __init__(self, batches: list[Any] | tuple[Any, ...], per_worker: bool = False) -> None:
        super().__init__()
        self._batches = batches
        self.per_worker = per_worker

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, index: int) -> Any:
        return self._batches[index]


def _is_batch_list(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and bool(x) and isinstance(x[0], (tuple, dict))


def adapt_input(x: Any) -> Any:
    """Returns what Keras should see for the ``x`` argument of ``fit``/``evaluate``/``predict``."""
    if isinstance(x, DistributedDataset):
        if x.options.auto_shard_policy is AutoShardPolicy.OFF:
            data = x.dataset
            return BatchList(data, per_worker=True) if _is_batch_list(data) else data
        return adapt_input(x.dataset)
    if isinstance(x, DistributedDatasetsFromFunction):
        return x.local_global_batches()
    if _is_batch_list(x):
        return BatchList(x)
    return x
