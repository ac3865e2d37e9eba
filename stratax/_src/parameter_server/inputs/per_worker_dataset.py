"""The chief's handles of per-worker input: ``PerWorkerDataset`` and ``PerWorkerIterator``.

What ``ClusterCoordinator.create_per_worker_dataset`` returns. The dataset is built on every
worker (``worker_input``) from what the chief described (``dataset_source``); on the chief,
``next(iterator)`` inside a scheduled function only records which worker batch a step reads.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import jax

from stratax._src.parameter_server.closures import LeafRef, recording
from stratax._src.parameter_server.inputs import dataset_source
from stratax._src.parameter_server.transport import structure

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
