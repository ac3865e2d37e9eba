"""``WorkerMetrics``: every worker reports its step time, throughput, input time and all-reduce.

How each number is measured (all on the worker's own clock, no extra collective per step):

- **step time, samples/s**: the callback wraps ``model.train_function`` for the duration of
  ``fit``. Once per report window (``every_seconds``) it waits for the step just dispatched to
  finish (``jax.block_until_ready`` of its logs) and divides the wall time since the previous
  window's wait by the steps dispatched in between. One wait per window (not per step) keeps
  JAX's asynchronous dispatch intact. The first call of each ``fit`` (it compiles the step) is
  waited for and left out; a window also closes where an epoch's steps end (before validation),
  so validation and epoch-end work count in no step. Samples are the rows of each batch this
  process feeds (a global array counts its share: rows / processes).
- **input time** (``input_s``): host seconds per step spent in ``next()`` of Keras' batch
  iterator (slicing, conversion, placement of the batch). It is the time the device can wait
  for input when the host is the bottleneck; when the host runs ahead it is hidden, so it is an
  upper bound of the true input wait.
- **all-reduce time** (``collective_s``): XLA fuses the gradient all-reduce into the compiled
  step, so it cannot be timed from outside without a profiler. It is *estimated* at the start of
  ``fit``: every worker runs ``strategy.run`` of an ``all_reduce(SUM)`` of a float32 buffer of
  the model's trainable size (one gradient), once to compile, then ``probe_repeats`` times; the
  median is reported as the per-step all-reduce time (reported as ``collective_s``, marked by
  ``collective_estimated=1``). Skipped with one replica (no all-reduce), and where not every
  process of the job observes the ``fit`` (a ``WorkerMetrics`` on the chief only, or
  ``--dashboard`` on some nodes): the probe is a collective, so the processes agree on it first
  through the coordination service (``agree_on_probe``), which costs no step.
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import jax
import keras
import numpy as np

from stratax._src.core.context import get_replica_context
from stratax._src.core.reduce_op import ReduceOp
from stratax._src.keras import call_stack
from stratax._src.keras.binding import model_strategy
from stratax._src.keras.steps.device_rows import RowBatch
from stratax._src.observe.record import MetricsWriter, writer_for
from stratax._src.observe.run_dir import PathLike, resolve_run_dir
from stratax._src.runtime import distributed
from stratax._src.strategies.base import Strategy
from stratax._src.strategies.multi_worker import DEFAULT_TIMEOUT_SECONDS

logger = logging.getLogger(__name__)
_FITS = itertools.count()  # this process' multi-process fit calls: the agreement's key


class _Window:
    """Counters of the steps dispatched since the last report."""

    def __init__(self) -> None:
        self.steps = 0
        self.samples = 0.0
        self.input_seconds = 0.0
        self.start = time.perf_counter()

    def reset(self, now: float) -> None:
        self.steps, self.samples, self.input_seconds, self.start = 0, 0.0, 0.0, now


class _TimedIterator:
    """Wraps Keras' batch iterator: counts steps and rows, times ``next()``."""

    def __init__(self, inner: Iterator[Any], window: _Window, rows: Callable[[Any], float]) -> None:
        self._inner = inner
        self._window = window
        self._rows = rows

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        data = next(self._inner)
        self._window.input_seconds += time.perf_counter() - start
        self._window.steps += 1
        self._window.samples += self._rows(data)
        return data


class WorkerMetrics(keras.callbacks.Callback):
    """Reports this worker's training speed to the run directory, for the dashboard.

    Add it on every worker (it is cheap: see ``benchmarks/workloads/observe_overhead.py``);
    each writes ``<run_dir>/metrics/<task>.jsonl`` about once per ``every_seconds``: ``step``,
    ``epoch``, ``step_s``, ``samples_per_s``, ``input_s``, ``loss`` (Keras' running epoch
    mean), and ``collective_s`` (estimated, see the module docstring); at each epoch end, every
    value of Keras' epoch logs (``loss``, ``accuracy``, ``val_loss``, ...); at the first step,
    the step ``fit`` starts from (``fit_begin=1``). Steps count on across ``fit`` calls of one
    callback and, after a resume through ``sx.BackupAndRestore``, from the global step it restored.

    Args:
        run_dir: the run directory; default ``$STRATAX_RUN_DIR`` (set by ``stratax launch
            --dashboard`` and ``stratax train --dashboard``).
        task: this worker's name; default from the environment (``worker_<rank>``).
        every_seconds: length of a report window.
        probe_repeats: timed all-reduces of the start-of-``fit`` estimate; 0 disables it.

    Raises:
        ValueError: no run directory (argument or ``STRATAX_RUN_DIR``), or a bad number.

    Example:
        >>> model.fit(x, y, batch_size=256, epochs=5,
        ...           callbacks=[sx.callbacks.WorkerMetrics("runs/exp1")])  # doctest: +SKIP
    """

    def __init__(self, run_dir: PathLike | None = None, *, task: str | None = None,
                 every_seconds: float = 1.0, probe_repeats: int = 5) -> None:
        super().__init__()
        if not isinstance(every_seconds, (int, float)) or not every_seconds > 0:
            raise ValueError(f"every_seconds must be a number > 0, got {every_seconds!r}.")
        if isinstance(probe_repeats, bool) or not isinstance(probe_repeats, int) \
                or probe_repeats < 0:
            raise ValueError(f"probe_repeats must be an int >= 0, got {probe_repeats!r}.")
        writer = writer_for(run_dir, task)
        if writer is None:
            raise ValueError(
                "WorkerMetrics needs a run directory: pass WorkerMetrics(run_dir='runs/exp1'), "
                "or start the program with `stratax launch --dashboard ...` (it sets "
                "STRATAX_RUN_DIR)."
            )
        self.writer: MetricsWriter = writer
        self.every_seconds = float(every_seconds)
        self.probe_repeats = probe_repeats
        self.collective_s: float | None = None
        self._window = _Window()
        self._original: Callable[..., Any] | None = None
        self._step = 0
        self._epoch = 0
        self._processes = 1
        self._warm = False
        self._last_logs: Any = None
        self._synchronous = False
        self._rows_by_shape: dict[tuple[type, tuple[int, ...]], float] = {}
        # Whether every process of a multi-process fit probes too (``agree_on_probe``).
        self.probe_everywhere = False

    # ------------------------------------------------------------------ keras hooks
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        strategy = model_strategy(self.model)
        self._processes = strategy.num_processes if strategy is not None else 1
        # All-reduce strategies step together: the dashboard then names a straggler by its
        # input wait, not by its step time (observe.reader.find_straggler).
        self._synchronous = isinstance(strategy, Strategy) and strategy.num_replicas_in_sync > 1
        self._rows_by_shape.clear()
        if strategy is not None and strategy.num_replicas_in_sync > 1 and self.probe_repeats \
                and (self._processes == 1 or self.probe_everywhere):
            self.collective_s = probe_all_reduce(strategy, _trainable_size(self.model),
                                                 self.probe_repeats)
        self._original = self.model.train_function
        self.model.train_function = self._timed_train_function
        self._warm = False
        self._last_logs = None
        self._window.reset(time.perf_counter())

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._original is not None:
            self.model.train_function = self._original
            self._original = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._window.reset(time.perf_counter())  # time between epochs is no step's

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._original is not None:  # validation inside fit: the epoch's steps end here
            self._close_window()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._close_window()
        scalars = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
        self.writer.write(self._step, epoch=epoch, epoch_end=1, **scalars)

    # ------------------------------------------------------------------ measurement
    def _timed_train_function(self, state: Any, iterator: Iterator[Any]) -> Any:
        original = cast(Callable[..., Any], self._original)  # set by on_train_begin
        if not self._warm:
            self._report_begin()
        logs, new_state = original(state, _TimedIterator(iterator, self._window, self._rows))
        self._last_logs = logs
        window = self._window
        if not self._warm:  # the first call compiles the step: not timed
            jax.block_until_ready(logs)
            self._warm = True
            self._step += window.steps
            window.reset(time.perf_counter())
        elif time.perf_counter() - window.start >= self.every_seconds and window.steps:
            jax.block_until_ready(logs)
            self._report(logs, time.perf_counter())
        return logs, new_state

    def _report_begin(self) -> None:
        """At the first step of ``fit``, once every callback's ``on_train_begin`` ran: numbers
        steps on from the global step a ``BackupAndRestore`` restored (a resumed run continues
        its step axis instead of counting from the resumed epoch), and reports that step with
        ``fit_begin=1``, where the dashboard marks the restart on its step axis."""
        call = call_stack.active()
        if call is not None and call.resumed_step is not None:
            self._step = call.resumed_step
        self.writer.write(self._step, epoch=self._epoch, fit_begin=1)

    def _close_window(self) -> None:
        """Reports the steps of the open window, if any (waiting for the last to finish)."""
        if self._window.steps and self._warm:
            jax.block_until_ready(self._last_logs)
            self._report(self._last_logs, time.perf_counter())

    def _report(self, logs: Any, now: float) -> None:
        window = self._window
        elapsed = now - window.start
        self._step += window.steps
        loss = logs.get("loss") if isinstance(logs, dict) else None
        scalars: dict[str, Any] = {
            "epoch": self._epoch,
            "step_s": elapsed / window.steps,
            "samples_per_s": window.samples / elapsed if elapsed > 0 else None,
            "input_s": window.input_seconds / window.steps,
            "loss": None if loss is None else float(np.asarray(loss)),
        }
        if self.collective_s is not None:
            scalars["collective_s"] = self.collective_s
            scalars["collective_estimated"] = 1
        if self._synchronous:
            scalars["synchronous"] = 1
        self.writer.write(self._step, **scalars)
        window.reset(now)

    def _rows(self, data: Any) -> float:
        if isinstance(data, RowBatch):  # a global batch named by its rows (arrays kept on the
            return data.size / self._processes  # devices): this process's share
        # Keras batches are (x, y, sample_weight) tuples; look at x before walking the tree.
        first = data[0] if isinstance(data, tuple) and data else data
        if not getattr(first, "shape", None):
            leaves = jax.tree.leaves(data)
            first = leaves[0] if leaves else None
            if not getattr(first, "shape", None):
                return 0.0
        key = (type(first), first.shape)
        rows = self._rows_by_shape.get(key)
        if rows is None:  # once per batch shape: a global array counts this process's share
            rows = float(first.shape[0])
            if isinstance(first, jax.Array) and not first.is_fully_addressable:
                rows /= self._processes
            self._rows_by_shape[key] = rows
        return rows


def _trainable_size(model: Any) -> int:
    return int(sum(int(np.prod(v.shape)) for v in model.trainable_variables))


def probe_all_reduce(strategy: Any, num_floats: int, repeats: int) -> float | None:
    """Median seconds of ``repeats`` all-reduces (SUM) of ``num_floats`` float32 over ``strategy``.

    Every process of the strategy must call it at the same point (it is a collective). Returns
    ``None`` for an empty model.
    """
    if num_floats <= 0:
        return None
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.zeros((num_floats,), np.float32))

    def all_reduce(x: Any) -> Any:
        return get_replica_context().all_reduce(ReduceOp.SUM, x)

    jax.block_until_ready(strategy.run(all_reduce, args=(value,)))  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(strategy.run(all_reduce, args=(value,)))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def with_default_reporter(callbacks: Any) -> Any:
    """``fit``'s ``callbacks`` plus a ``WorkerMetrics`` when the run has a run directory
    (``stratax launch``/``train`` with ``--dashboard`` or ``--run-dir`` set
    ``STRATAX_RUN_DIR``) and none is among them, so that the dashboard shows every ``fit``
    without the user adding a callback."""
    if resolve_run_dir() is None:
        return callbacks
    as_list = isinstance(callbacks, keras.callbacks.CallbackList)
    given = list(callbacks.callbacks if as_list else callbacks or [])
    if any(isinstance(c, WorkerMetrics) for c in given):
        return callbacks
    if as_list:
        callbacks.append(WorkerMetrics())
        return callbacks
    return [*given, WorkerMetrics()]


def agree_on_probe(callbacks: Any, strategy: Any) -> None:
    """Lets this ``fit``'s ``WorkerMetrics`` probe the all-reduce only where every process of a
    multi-process strategy has one that probes (the probe is a collective: a process without it
    would leave the others' unmatched). Every process of the job calls it at the start of
    ``fit``, with or without a reporter of its own.

    Raises:
        CollectiveTimeoutError: a process did not start this ``fit`` within the strategy's
            communication timeout.
    """
    if not (isinstance(strategy, Strategy) and strategy.num_processes > 1
            and strategy.num_replicas_in_sync > 1):
        return
    given = callbacks.callbacks if isinstance(callbacks, keras.callbacks.CallbackList) \
        else callbacks or []
    reporters = [c for c in given if isinstance(c, WorkerMetrics) and c.probe_repeats]
    options = getattr(strategy, "communication_options", None)
    wants = distributed.published_and_gathered(
        f"stratax/worker_metrics/fit{next(_FITS)}/", "1" if reporters else "0",
        options.effective_timeout if options is not None else DEFAULT_TIMEOUT_SECONDS,
        "the start of its fit")
    everywhere = all(want == "1" for want in wants)
    for reporter in reporters:
        reporter.probe_everywhere = everywhere
    if reporters and not everywhere:
        logger.info("WorkerMetrics: no all-reduce estimate (collective_s) in this fit: processes "
                    "%s do not observe it; observe every worker, or none, to have it",
                    [p for p, want in enumerate(wants) if want != "1"])
