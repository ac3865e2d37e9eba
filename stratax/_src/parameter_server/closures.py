"""What a scheduled function becomes: a recorded closure and the values it returns.

``ClusterCoordinator.schedule`` runs the user's function once on the chief while recording
(:func:`recording_into`): ``next(per_worker_iterator)`` yields :class:`LeafRef` placeholders and
``strategy.run`` appends an exported program to the :class:`Closure`, returning
:class:`Output` placeholders. When the workers answer, the closure resolves those placeholders
into its :class:`RemoteValue` (with ``strategy.reduce`` applied over the workers).
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from stratax._src.core.reduce_op import ReduceOp
from stratax._src.parameter_server.program import Program


class RemoteValueStatus(enum.Enum):
    """State of a scheduled closure's result.

    Transitions: ``PENDING`` -> ``SUCCEEDED`` (the worker returned outputs) or ``FAILED``
    (the step raised, no worker came back within ``timeout_seconds`` after all were lost, or
    another closure failed first: ``StepCancelledError``, queued and running closures alike);
    ``PENDING`` stays ``PENDING`` when a dead worker's closure is re-queued. ``SUCCEEDED`` and
    ``FAILED`` are final: a cancelled closure that finishes later changes nothing.
    """

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class RemoteValue:
    """The result of ``ClusterCoordinator.schedule``: ``fetch()`` waits and returns numpy
    values."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self.status = RemoteValueStatus.PENDING

    def _set(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self.status = RemoteValueStatus.FAILED if error else RemoteValueStatus.SUCCEEDED
        self._done.set()

    def fetch(self, timeout: float | None = None) -> Any:
        """Waits for the closure (at most ``timeout`` s) and returns its outputs.

        Raises:
          TimeoutError: Not done within ``timeout``.
          StepError: The closure failed (the message names the worker); also the step's own
            builtin exception type (e.g. ``ValueError``) when it raised one.
          StepCancelledError: Another closure failed first (TensorFlow's ``CancelledError``).
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"Scheduled function not done after {timeout} s.")
        if self._error is not None:
            raise self._error
        return self._value

    def get(self, timeout: float | None = None) -> Any:
        """Same as ``fetch`` (TensorFlow's ``RemoteValue.get``)."""
        return self.fetch(timeout)


class PerWorkerValues:
    """One value per worker (TensorFlow's ``PerWorkerValues``)."""

    def __init__(self, values: Sequence[Any]) -> None:
        self._values = tuple(values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


class LeafRef:
    """Placeholder for one leaf of a batch inside a closure being recorded."""

    def __init__(self, batch: int, leaf: int, spec: jax.ShapeDtypeStruct) -> None:
        self.batch, self.leaf, self.spec = batch, leaf, spec

    def __repr__(self) -> str:
        return f"<batch {self.batch} leaf {self.leaf} {self.spec.shape} {self.spec.dtype}>"


class Output:
    """Placeholder for one output leaf of one recorded run, with the ``strategy.reduce`` to
    apply over the workers' values (synchronous mode) and along ``axis``."""

    def __init__(self, run: int, leaf: int, op: ReduceOp | None = None,
                 axis: int | None = None) -> None:
        self.run, self.leaf, self.op, self.axis = run, leaf, op, axis

    def resolve(self, per_worker: list[list[list[np.ndarray]]]) -> Any:
        """The value from each worker's outputs (``per_worker[w][run][leaf]``)."""
        values = [np.array(outputs[self.run][self.leaf]) for outputs in per_worker]
        if self.op is None:
            return values[0] if len(values) == 1 else PerWorkerValues(values)
        if self.axis is not None:
            count = sum(v.shape[self.axis] for v in values)
            combine = {ReduceOp.SUM: np.sum, ReduceOp.MEAN: np.sum, ReduceOp.MAX: np.max,
                       ReduceOp.MIN: np.min}[self.op]
            values = [combine(v, axis=self.axis) for v in values]
            if self.op is ReduceOp.MEAN:
                return np.sum(values, axis=0) / count
        stacked = np.stack(values)
        return {ReduceOp.SUM: np.sum, ReduceOp.MEAN: np.mean, ReduceOp.MAX: np.max,
                ReduceOp.MIN: np.min}[self.op](stacked, axis=0)


def reduce_outputs(op: Any, value: Any, axis: int | None) -> Any:
    """``strategy.reduce`` inside a scheduled function: marks ``run`` outputs to be reduced
    over the workers (synchronous mode) and along ``axis``."""
    reduce_op = ReduceOp.from_string(op)
    return jax.tree_util.tree_map(
        lambda x: Output(x.run, x.leaf, reduce_op, axis) if isinstance(x, Output) else x,
        value, is_leaf=lambda x: isinstance(x, Output))


class _Recording(threading.local):
    def __init__(self) -> None:
        self.closure: Closure | None = None


_recording = _Recording()


def is_recording() -> bool:
    """Whether a function given to ``schedule`` is being recorded on this thread."""
    return _recording.closure is not None


@contextlib.contextmanager
def recording_into(closure: Closure) -> Iterator[Closure]:
    """Records the ``strategy.run`` calls and batches of a scheduled function into ``closure``
    while the block runs on this thread."""
    _recording.closure = closure
    try:
        yield closure
    finally:
        _recording.closure = None


def recording() -> Closure:
    """The closure being recorded; raises if not inside ``schedule``."""
    if _recording.closure is None:
        raise RuntimeError(
            "ParameterServerStrategy.run is called inside a function given to "
            "`coordinator.schedule(fn, args=...)`; call it there."
        )
    return _recording.closure


class Closure:
    """One scheduled function as recorded: its batches, its ``strategy.run`` programs, the
    structure it returns, and the outputs each worker sent back."""

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.iterators: list[Any] = []  # the PerWorkerIterator of each batch, in order
        self.batches = 0
        self.runs: list[dict[str, Any]] = []
        self.programs: list[Program] = []
        self.result_tree: Any = None
        self.remote = RemoteValue()
        self.parts: dict[int, list[list[np.ndarray]]] = {}  # worker index -> outputs per run
        self.pinned = False  # synchronous mode: one part per worker, each on its own worker
        self.after: str | None = None  # synchronous mode: the previous closure's last step
        self.data: Any = None  # an ArrayData whose batches this closure names by rows
        self.rows: list[np.ndarray] = []

    def resolve(self, num_parts: int) -> None:
        """Sets the RemoteValue once every part's outputs arrived; nothing when it is already
        final (cancelled while running)."""
        if len(self.parts) < num_parts or self.remote.status is not RemoteValueStatus.PENDING:
            return
        per_worker = [self.parts[w] for w in sorted(self.parts)]
        self.remote._set(jax.tree_util.tree_map(
            lambda x: x.resolve(per_worker) if isinstance(x, Output) else x,
            self.result_tree, is_leaf=lambda x: isinstance(x, Output)))

    def add_run(self, program: Program, refs: Sequence[LeafRef]) -> Any:
        index = len(self.runs)
        self.runs.append({"program": program.key, "args": [[r.batch, r.leaf] for r in refs]})
        self.programs.append(program)
        return jax.tree_util.tree_unflatten(
            program.out_treedef, [Output(index, i) for i in range(program.out_treedef.num_leaves)])
