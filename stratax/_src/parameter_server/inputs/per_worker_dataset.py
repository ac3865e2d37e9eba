"""The chief's handles of per-worker input: ``PerWorkerDataset`` and ``PerWorkerIterator``.

What ``ClusterCoordinator.create_per_worker_dataset`` returns. The dataset is built on every
worker (``worker_input``) from what the chief described (``dataset_source``), by
``build_on_workers``; on the chief, ``next(iterator)`` inside a scheduled function only records
which worker batch a step reads.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.closures import LeafRef, recording
from stratax._src.parameter_server.inputs import dataset_source
from stratax._src.parameter_server.transport import structure

logger = logging.getLogger(__name__)
MIXED_SOURCES = ("A scheduled function reads per-worker iterators or one ArrayData, not both; "
                 "schedule them in separate functions.")


class PerWorkerIterator:
    """An iterator per worker over its own ``dataset_fn`` batches (built on the workers).

    A scheduled function may read several (each ``next`` is one more batch of that one). When
    it is garbage collected, ``release`` is called with its name: the workers drop it.
    """

    def __init__(self, name: str, tree: Any, specs: list[jax.ShapeDtypeStruct],
                 release: Callable[[str], None] | None = None) -> None:
        self.name, self._tree, self._specs = name, tree, specs
        if release is not None:
            weakref.finalize(self, release, name).atexit = False

    def __iter__(self) -> PerWorkerIterator:
        return self

    @property
    def element_spec(self) -> Any:
        """One batch's structure with ``jax.ShapeDtypeStruct`` leaves (TF's ``element_spec``)."""
        return structure.build(self._tree, self._specs)

    def __next__(self) -> Any:
        closure = recording()
        if closure.data is not None:
            raise ValueError(MIXED_SOURCES)
        closure.iterators.append(self)
        batch = closure.batches
        closure.batches += 1
        return structure.build(self._tree,
                               [LeafRef(batch, i, s) for i, s in enumerate(self._specs)])


class PerWorkerDataset:
    """What ``create_per_worker_dataset`` returns; ``iter()`` builds an iterator on every worker.

    ``build()`` builds the dataset once on each live worker and reads the structure of its
    batches (``element_spec``) without keeping an iterator there.
    """

    def __init__(self, coordinator: Any, source: dataset_source.Source) -> None:
        self._coordinator, self._source = coordinator, source
        self._spec: tuple[Any, list[jax.ShapeDtypeStruct]] | None = None

    def build(self) -> None:
        """Builds the dataset on the live workers and checks they yield one batch structure.

        Raises:
          ValueError: the workers' batches differ in structure, shape or dtype.
          WorkerUnavailableError: no worker answered.
        """
        if self._spec is None:
            self._spec = self._coordinator._dataset_spec(self._source)

    @property
    def element_spec(self) -> Any:
        """One batch's structure with ``jax.ShapeDtypeStruct`` leaves (TF's ``element_spec``);
        builds the dataset first if needed."""
        self.build()
        tree, specs = self._spec
        return structure.build(tree, specs)

    def __iter__(self) -> PerWorkerIterator:
        return self._coordinator._make_iterator(self._source)


def build_on_workers(workers: Sequence[Any], method: str, meta: dict[str, Any],
                     source: dataset_source.Source) -> dict[int, Any]:
    """Sends ``source`` with ``meta`` to every worker of ``workers`` (the coordinator's live
    ones) in a ``method`` call (``iterator``, ``dataset_spec``); returns the replies by
    worker.

    As in TensorFlow, a worker that does not answer (down, not yet noticed) does not fail
    the call: it is marked dead, and its serving thread takes it back when it answers
    again, rebuilding every registered iterator there (``recovery.revive``).

    Raises:
      WorkerUnavailableError: no worker answered.
    """
    replies, lost = {}, []
    for worker in workers:
        try:
            replies[worker.index] = worker.client.call(
                method, {**meta, "source": source.meta}, source.tensors,
                stream=bool(source.tensors))
        except WorkerUnavailableError as err:
            logger.warning("%s; it gets this dataset when it answers again", err)
            worker.died_at = time.monotonic()
            worker.alive = False
            lost.append(str(err))
    if not replies:
        raise WorkerUnavailableError("No worker answered to build the dataset: "
                                     + "; ".join(lost))
    return replies


def batch_spec(replies: dict[int, Any]) -> tuple[Any, list[jax.ShapeDtypeStruct]]:
    """``(structure, leaf specs)`` of the workers' batches, which must agree.

    Raises:
      ValueError: two workers' batches differ.
    """
    first_index, first = next(iter(replies.items()))
    for index, reply in replies.items():
        if (reply.meta["specs"] != first.meta["specs"]
                or reply.meta["structure"] != first.meta["structure"]):
            raise ValueError(
                f"Worker {index}'s dataset yields {reply.meta['specs']}, worker "
                f"{first_index}'s {first.meta['specs']}; every worker's batches need one "
                "structure and shape.")
    return first.meta["structure"], [jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))
                                     for dtype, shape in first.meta["specs"]]
