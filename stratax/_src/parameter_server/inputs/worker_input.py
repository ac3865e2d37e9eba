"""A per-worker dataset built on the worker from what ``dataset_source`` described.

A function runs here as ``fn(input_context)`` (or ``fn()`` when it takes no argument), where
``input_context`` says this worker's ``input_pipeline_id`` among ``num_input_pipelines`` (the
workers). The guide's per-worker function calls ``strategy.distribute_datasets_from_function``
or ``experimental_distribute_dataset``, but a worker has no strategy (its process serves from
inside the ``ParameterServerStrategy(...)`` call, or loaded the script only up to it): the
global names that held the strategy on the chief are bound here to :class:`WorkerStrategy`,
whose two data methods return the dataset this worker iterates.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from stratax._src.distributed_input.input_context import InputContext
from stratax._src.parameter_server import functions
from stratax._src.parameter_server.inputs import tf_dataset_wire

_current = threading.local()


def current_input_context() -> InputContext:
    """The input context of the per-worker dataset being built on this worker.

    Raises:
      RuntimeError: not inside a per-worker dataset function on a worker.
    """
    context = getattr(_current, "context", None)
    if context is None:
        raise RuntimeError(
            "This strategy stands in for the chief's ParameterServerStrategy on a worker; only "
            "its distribute_datasets_from_function / experimental_distribute_dataset work, "
            "inside the function given to coordinator.create_per_worker_dataset.")
    return context


@contextlib.contextmanager
def _building(context: InputContext) -> Iterator[None]:
    previous = getattr(_current, "context", None)
    _current.context = context
    try:
        yield
    finally:
        _current.context = previous


class WorkerStrategy:
    """The chief's strategy as a per-worker dataset function sees it on a worker.

    Example:
      >>> def per_worker_dataset_fn():                                # doctest: +SKIP
      ...     return strategy.distribute_datasets_from_function(dataset_fn)
    """

    def distribute_datasets_from_function(self, dataset_fn: Callable[[InputContext], Any],
                                          options: Any = None) -> Any:
        """``dataset_fn(input_context)`` for this worker."""
        return dataset_fn(current_input_context())

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        """``dataset`` itself: each worker iterates all of it, as in TensorFlow's
        parameter-server strategy (shard it with ``distribute_datasets_from_function``)."""
        current_input_context()
        return dataset

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"strategy.{name} does not exist on a worker: a per-worker dataset function may "
            "call strategy.distribute_datasets_from_function and "
            "experimental_distribute_dataset; the rest of the strategy lives on the chief.")


def build_dataset(meta: dict[str, Any], tensors: Sequence[np.ndarray],
                  context: InputContext) -> Any:
    """The dataset (any iterable of batches) that ``meta`` and ``tensors`` describe.

    Raises:
      ValueError: ``meta`` names neither a function nor a dataset graph.
    """
    if "graph" in meta:
        if len(tensors) != 1:
            raise ValueError(f"A dataset graph comes as one tensor, got {len(tensors)}.")
        return tf_dataset_wire.decode(meta["graph"], tensors[0])
    if "fn" not in meta:
        raise ValueError(f"A per-worker dataset needs 'fn' or 'graph', got {sorted(meta)}.")
    fn = functions.resolve(meta["fn"])
    namespace = getattr(fn, "__globals__", None)
    if isinstance(namespace, dict):  # what held the strategy on the chief cannot hold it here
        for name in meta["fn"].get("strategies", []):
            if not isinstance(namespace.get(name), WorkerStrategy):
                namespace[name] = WorkerStrategy()
    with _building(context):
        if meta.get("input_context") or _takes_argument(fn):
            return fn(context)
        return fn()


def _takes_argument(fn: Callable[..., Any]) -> bool:
    try:
        return bool(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return True
