"""Per-worker variables: one independent, unsynchronized copy on each worker.

TensorFlow's ``tf.Variable(..., per_worker_variable=True)`` under a ``ParameterServerStrategy``
(its ``PerWorkerVariable``): state a worker keeps for itself, such as the step counter of its
own data or a lookup layer's per-worker vocabulary. Here
``strategy.create_variable(value, per_worker=True)`` makes one. No parameter server holds it:

- a worker creates its copy from the initial value the first time a closure that uses it
  arrives (``ClusterCoordinator`` sends the value with the program); a restarted worker lost its
  copy with its process and gets a fresh one from the initial value, as TensorFlow re-creates a
  recovered worker's resources;
- inside a scheduled step, ``strategy.read(v)`` gives the running worker's copy and
  ``strategy.assign(v, new)`` writes it there, right after the step's compute (``program``);
- on the chief, ``v.read_all()`` returns each worker's current value (TensorFlow's name).

They are not trained: ``apply_gradients`` refuses them, as TensorFlow does not aggregate them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.transport.rpc import RemoteError

MISSING = "No per-worker variable"  # a worker's error for a copy it lacks (recovery knows it)


class PerWorkerVariable:
    """A variable with one copy per worker (TensorFlow's ``PerWorkerVariable``).

    Attributes:
      name: The variable's name (unique among the strategy's variables).
      key: Its name on the workers (with the strategy's namespace).
      initial_value: What a worker's copy starts from (read-only).
      shape, dtype: Those of every copy; the dtype is the one JAX computes in (``int64`` is
        kept only under ``jax_enable_x64``, else it becomes ``int32``), so a copy keeps one
        dtype from its creation through every step.
      trainable: Always False: the copies are state, never trained.

    Example:
      >>> steps = strategy.create_variable(0, name="steps", per_worker=True)   # doctest: +SKIP
      >>> def replica_fn(x):                                                    # doctest: +SKIP
      ...     strategy.assign(steps, strategy.read(steps) + 1)
      >>> steps.read_all()        # after coordinator.join()                   # doctest: +SKIP
      [array(7), array(5)]
    """

    trainable = False

    def __init__(self, name: str, key: str, initial_value: np.ndarray,
                 read_all: Callable[[PerWorkerVariable], list[np.ndarray]]) -> None:
        self.name = name
        self.key = key
        value = np.asarray(initial_value)
        self.initial_value = value.astype(jax.dtypes.canonicalize_dtype(value.dtype))
        self.initial_value.flags.writeable = False
        self.shape = self.initial_value.shape
        self.dtype = self.initial_value.dtype
        self._read_all = read_all

    def read_all(self) -> list[np.ndarray]:
        """Each worker's current value, in worker order (a worker that has not run a step using
        the variable yet holds the initial value).

        Raises:
          WorkerUnavailableError: a worker is down or was restarted and not yet taken back by
            the coordinator; read again once it runs closures.
        """
        return self._read_all(self)

    def __repr__(self) -> str:
        return (f"<PerWorkerVariable {self.name!r} shape={self.shape} dtype={self.dtype} "
                "one copy per worker>")


def refuse_training(var: PerWorkerVariable, what: str) -> TypeError:
    """The error for ``what`` (``apply_gradients``, ``read_rows``) given a per-worker variable."""
    return TypeError(
        f"{what} got the per-worker variable {var.name!r}: each worker's copy is its own, and "
        "no parameter server aggregates or trains it (as in TensorFlow). Read it with "
        f"strategy.read({var.name}) and update it with strategy.assign({var.name}, new_value).")


class WorkerCopies:
    """A worker's copies of the per-worker variables, by key (the worker task's side)."""

    def __init__(self, task_index: int) -> None:
        self._task_index = task_index
        self._values: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def create(self, keys: Sequence[str], values: Sequence[np.ndarray]) -> None:
        """Creates the copies not yet here from their initial ``values``; existing copies keep
        their value (the chief may send a creation twice, from a step and from ``read_all``)."""
        with self._lock:
            for key, value in zip(keys, values, strict=True):
                self._values.setdefault(key, np.array(value))

    def read(self, keys: Sequence[str]) -> list[np.ndarray]:
        """The current values of ``keys``.

        Raises:
          KeyError: a copy is missing (this worker process was restarted: the chief recreates
            its copies when it takes the worker back).
        """
        with self._lock:
            missing = [key for key in keys if key not in self._values]
            if missing:
                raise KeyError(f"{MISSING} {missing} on worker {self._task_index}.")
            return [self._values[key] for key in keys]

    def write(self, keys: Sequence[str], values: Sequence[Any]) -> None:
        """Stores a step's new values of ``keys``."""
        with self._lock:
            for key, value in zip(keys, values, strict=True):
                self._values[key] = np.asarray(value)

    def clear(self) -> None:
        """Forgets every copy (a new chief session took over)."""
        with self._lock:
            self._values.clear()


def ensure_created(worker: Any, variables: Sequence[PerWorkerVariable]) -> None:
    """Sends ``worker`` (the coordinator's record of it: ``client`` and ``per_worker``, the
    keys it holds) the initial values of those ``variables`` it does not hold yet."""
    missing = list({v.key: v for v in variables if v.key not in worker.per_worker}.values())
    if missing:
        worker.client.call("create_per_worker", {"names": [v.key for v in missing]},
                           [v.initial_value for v in missing], stream=True)
        worker.per_worker.update(v.key for v in missing)


def read_all(workers: Sequence[Any], var: PerWorkerVariable) -> list[np.ndarray]:
    """Each of the coordinator's ``workers``' value of ``var`` (``PerWorkerVariable.read_all``).

    Raises:
      WorkerUnavailableError: a worker is down, or answers as a new process whose copy the
        coordinator has not recreated yet.
    """
    values = []
    for worker in workers:
        where = f"worker {worker.index} at {worker.client.address}"
        if not worker.alive or worker.restarted:
            raise WorkerUnavailableError(
                f"Cannot read {var.name!r} on {where}: it is down or was restarted; the "
                "coordinator takes it back (with a fresh copy from the initial value) when it "
                "runs closures again. Call read_all() after the next coordinator.join().")
        ensure_created(worker, [var])
        try:
            reply = worker.client.call("read_per_worker", {"names": [var.key]})
        except RemoteError as err:
            if MISSING not in str(err):
                raise
            raise WorkerUnavailableError(
                f"Cannot read {var.name!r} on {where}: it was restarted and lost its copy; "
                "call read_all() again after the next coordinator.join().") from None
        values.append(np.array(reply.tensors[0]))
    return values
