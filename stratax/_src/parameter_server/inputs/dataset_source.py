"""What ``create_per_worker_dataset`` accepts, described for the workers (chief side).

TensorFlow's ``create_per_worker_dataset`` takes a function (run on each worker), a
``tf.data.Dataset``, or what ``strategy.distribute_datasets_from_function`` /
``experimental_distribute_dataset`` return. Each becomes a :class:`Source`: the JSON the
worker's ``iterator`` request carries and its tensors. A function travels by name
(``functions``) with the names under which its module holds the strategy, so that the guide's
``def per_worker_dataset_fn(): return strategy.distribute_datasets_from_function(dataset_fn)``
runs on a worker too (``worker_input`` binds them there); a dataset travels as its graph
(``tf_dataset_wire``). ``worker_input`` builds each kind on the worker.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from stratax._src.parameter_server import functions
from stratax._src.parameter_server.inputs import tf_dataset_wire


@dataclasses.dataclass(frozen=True)
class Source:
    """A per-worker dataset as the workers receive it: ``meta`` (JSON) and ``tensors``."""

    meta: dict[str, Any]
    tensors: tuple[np.ndarray, ...] = ()


class DistributedDatasetsFromFunction:
    """``strategy.distribute_datasets_from_function(dataset_fn)`` called on the chief: built on
    each worker, as ``dataset_fn(input_context)``, once given to
    ``coordinator.create_per_worker_dataset``."""

    def __init__(self, dataset_fn: Callable[..., Any], options: Any = None) -> None:
        if not callable(dataset_fn):
            raise TypeError(f"distribute_datasets_from_function needs a callable dataset_fn, got "
                            f"{dataset_fn!r}.")
        self.dataset_fn, self.options = dataset_fn, options

    def __iter__(self) -> Any:
        raise _not_on_chief("distribute_datasets_from_function")


class DistributedDataset:
    """``strategy.experimental_distribute_dataset(dataset)`` called on the chief: every worker
    iterates a copy of ``dataset`` (not sharded, as in TensorFlow's parameter-server strategy)
    once given to ``coordinator.create_per_worker_dataset``."""

    def __init__(self, dataset: Any, options: Any = None) -> None:
        if not tf_dataset_wire.is_tf_dataset(dataset):
            raise TypeError(
                f"experimental_distribute_dataset under ParameterServerStrategy takes a "
                f"tf.data.Dataset (sent to the workers as its graph), got {type(dataset)!r}; for "
                "other inputs use distribute_datasets_from_function(dataset_fn).")
        self.dataset, self.options = dataset, options

    @property
    def element_spec(self) -> Any:
        """The wrapped dataset's ``element_spec``."""
        return self.dataset.element_spec

    def __iter__(self) -> Any:
        raise _not_on_chief("experimental_distribute_dataset")


def _not_on_chief(what: str) -> ValueError:
    """The error of iterating ``strategy.<what>(...)``'s result on the chief: a ``ValueError``,
    the type TensorFlow raises there (its ``testDistributeDatasetUsedDirectly``)."""
    return ValueError(
        f"The dataset from strategy.{what}(...) is read by the workers, not on the chief: pass "
        "it to coordinator.create_per_worker_dataset(...) and iterate that inside a scheduled "
        "function.")


def describe(source: Any, strategy: Any) -> Source:
    """The :class:`Source` for what ``create_per_worker_dataset`` of ``strategy``'s
    coordinator was given.

    Raises:
      TypeError: ``source`` is none of a function, a ``tf.data.Dataset`` or the result of
        ``distribute_datasets_from_function`` / ``experimental_distribute_dataset``.
      ValueError: a function the workers cannot import by name, or a dataset without a graph.
    """
    if isinstance(source, DistributedDatasetsFromFunction):
        return Source({"fn": _function(source.dataset_fn, strategy), "input_context": True})
    if isinstance(source, DistributedDataset):
        source = source.dataset
    if tf_dataset_wire.is_tf_dataset(source):
        meta, graph = tf_dataset_wire.encode(source)
        return Source({"graph": meta}, (graph,))
    if callable(source):
        return Source({"fn": _function(source, strategy)})
    raise TypeError(
        f"create_per_worker_dataset takes a dataset function, a tf.data.Dataset, or what "
        f"strategy.distribute_datasets_from_function / experimental_distribute_dataset return; "
        f"got {type(source)!r}. Wrap other inputs in `def dataset_fn(input_context): ...`.")


def _function(fn: Callable[..., Any], strategy: Any) -> dict[str, Any]:
    """``functions.reference(fn)`` plus the global names through which ``fn`` reads
    ``strategy``."""
    ref = functions.reference(fn)
    namespace = getattr(fn, "__globals__", {})
    code = getattr(fn, "__code__", None)
    names = code.co_names if code is not None else ()
    ref["strategies"] = sorted(name for name in set(names) if namespace.get(name) is strategy)
    return ref
