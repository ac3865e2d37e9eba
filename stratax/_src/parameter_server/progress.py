"""The coordinator's progress line: per-worker steps/s and the slowest worker, every few seconds.

A ``ProgressReporter`` thread on the chief reads the coordinator's per-worker counters (steps,
seconds in calls, seconds pulling) every ``every_seconds`` and, for the window since its last
report, writes:

- one line to stderr (through the ``stratax.parameter_server.progress`` logger when
  ``stream=None``), e.g.::

    [stratax ps] 12.0 s, 1840 steps (+612, 61.2/s) | worker 0: 30.1 steps/s, 33.2 ms/step |
    worker 1: 4.1 steps/s, 244.0 ms/step  <- slowest, straggler (7.3x the others' median)

- with a run directory (``run_dir=`` or ``$STRATAX_RUN_DIR``, which ``stratax launch
  --dashboard`` sets), one JSON record per worker in the observe format
  (``<run_dir>/metrics/worker_<i>.jsonl``, written by the chief on the workers' behalf, since
  parameter-server workers run no user code): ``step`` (its steps so far), ``steps_per_s``,
  ``step_s`` (its time per step, below), ``input_s``, ``pull_s``, ``push_s`` (per step),
  ``slowest`` (1 for the slowest worker of the window), ``straggler`` (1 when it is also a
  straggler by the rule below) and ``slow_factor``. The dashboard shows them as worker rows.

The rule: a worker's **time per step** in the window is the seconds its calls took divided by
the steps they ran; in synchronous mode the seconds spent pulling are left out, because a fast
worker waits for the slowest one inside its pull (every worker runs every step, so their steps/s
are equal and only the time outside the wait tells them apart). The slowest worker is the one
with the largest time per step; it is flagged a **straggler** when that time is at least
``factor`` (default 1.5) times the median of the other workers'. A live worker that finished no
step in a window while closures were queued and other workers finished some counts as slowest,
with the window's length as its time per step (a lower bound).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from stratax._src.core.config import config
from stratax._src.observe.record import MetricsWriter
from stratax._src.observe.run_dir import PathLike, resolve_run_dir

logger = logging.getLogger(__name__)

DEFAULT_EVERY_SECONDS = config.option("ps_progress_seconds").default
DEFAULT_FACTOR = 1.5
_COUNTERS = ("steps", "wall", "pull", "data", "push", "exchange")


def resolve_every_seconds(every_seconds: float | None = None) -> float:
    """The report period: ``every_seconds`` if given, else ``$STRATAX_PS_PROGRESS_SECONDS``,
    else ``DEFAULT_EVERY_SECONDS``; 0 turns the periodic line off.

    Raises:
      ValueError: a value that is not a number >= 0, naming it.
    """
    if every_seconds is None:
        return config.ps_progress_seconds
    try:
        seconds = float(every_seconds)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(every_seconds, bool) or not seconds >= 0:
        raise ValueError(
            f"The progress period must be a number of seconds >= 0 (0 = off), got "
            f"{every_seconds!r}; e.g. ClusterCoordinator(strategy, progress_seconds=5).")
    return seconds


@dataclasses.dataclass
class WorkerWindow:
    """One worker's figures over one report window."""

    name: str
    steps_total: int
    steps: int
    steps_per_s: float
    step_s: float | None  # time per step (see the module docstring); None: no step, not judged
    input_s: float | None
    pull_s: float | None
    push_s: float | None
    alive: bool = True
    slowest: bool = False
    straggler: bool = False
    slow_factor: float | None = None


@dataclasses.dataclass
class Window:
    """A report: the window's length, total steps, and every worker's figures."""

    elapsed: float
    seconds: float
    steps_total: int
    steps: int
    workers: list[WorkerWindow]

    @property
    def slowest(self) -> WorkerWindow | None:
        return next((w for w in self.workers if w.slowest), None)


def judge(workers: list[WorkerWindow], factor: float = DEFAULT_FACTOR) -> None:
    """Marks the slowest worker (largest ``step_s``) and, by the rule of the module docstring,
    whether it is a straggler; workers with ``step_s`` None are not judged."""
    timed = [w for w in workers if w.step_s is not None]
    if len(timed) < 2:
        return
    slowest = max(timed, key=lambda w: w.step_s or 0.0)
    others = statistics.median(w.step_s or 0.0 for w in timed if w is not slowest)
    slowest.slowest = True
    if others > 0:
        slowest.slow_factor = (slowest.step_s or 0.0) / others
        slowest.straggler = slowest.slow_factor >= factor


def format_line(window: Window) -> str:
    """The human-readable progress line of ``window``."""
    rate = window.steps / window.seconds if window.seconds > 0 else 0.0
    parts = [f"[stratax ps] {window.elapsed:.1f} s, {window.steps_total} steps "
             f"(+{window.steps}, {rate:.1f}/s)"]
    for w in window.workers:
        if not w.alive:
            parts.append(f"{w.name}: dead")
            continue
        text = f"{w.name}: {w.steps_per_s:.1f} steps/s"
        if w.step_s is not None:
            text += f", {1000 * w.step_s:.1f} ms/step"
        if w.straggler:
            text += f"  <- slowest, straggler ({w.slow_factor:.1f}x the others' median)"
        elif w.slowest:
            text += "  <- slowest"
        parts.append(text)
    return " | ".join(parts)


class ProgressReporter:
    """Reports per-worker steps/s and the slowest worker of a ``ClusterCoordinator``.

    Args:
      read: Returns, per worker name, ``(alive, counters)`` with cumulative ``steps``, ``wall``,
        ``pull``, ``data`` and ``push`` seconds (the coordinator's per-worker stats).
      pending: Returns True while closures are queued or running (a worker without steps is
        then slow, not idle; a window without steps and without work is not counted).
      sync: Synchronous mode (pull time is left out of the time per step).
      every_seconds: Report period; 0 or less: never (``report()`` may still be called).
      run_dir: Where JSON records go; default ``$STRATAX_RUN_DIR``; none: the line only.
      stream: Where the line goes; ``None``: the logger at INFO.
      factor: The straggler threshold (see the module docstring).
      clock: Seconds, monotonic (tests pass their own).

    Example:
      >>> reporter = ProgressReporter(read, pending, every_seconds=5)   # doctest: +SKIP
      >>> reporter.start(); ...; reporter.stop()                          # doctest: +SKIP
    """

    def __init__(self, read: Callable[[], Mapping[str, tuple[bool, Mapping[str, float]]]],
                 pending: Callable[[], bool], *, sync: bool = False,
                 every_seconds: float = DEFAULT_EVERY_SECONDS, run_dir: PathLike | None = None,
                 stream: TextIO | None = sys.stderr, factor: float = DEFAULT_FACTOR,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 1:
            raise ValueError(f"The straggler factor must be a number > 1, got {factor!r}.")
        self._read, self._pending, self._sync = read, pending, sync
        self.every_seconds = float(every_seconds)
        self.factor = float(factor)
        self._stream = stream
        self._run_dir = resolve_run_dir(run_dir)
        self._writers: dict[str, MetricsWriter] = {}
        self._clock = clock
        self._start = self._last_time = clock()
        self._last: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_window: Window | None = None

    def start(self) -> None:
        """Starts the periodic reports (nothing when ``every_seconds`` <= 0)."""
        if self.every_seconds > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="stratax-ps-progress")
            self._thread.start()

    def stop(self) -> None:
        """Stops the reports, reports the last window (if any step ran) and closes the files."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.report()
        with self._lock:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_seconds):
            try:
                self.report()
            except Exception:  # a full disk must not stop training; say so once per window
                logger.exception("stratax ps progress report failed")

    def report(self) -> Window | None:
        """Measures the window since the last report, writes the line and records, and returns
        it; ``None`` (nothing written) when no worker finished a step in the window."""
        with self._lock:
            now = self._clock()
            seconds = now - self._last_time
            current = {name: (alive, {k: float(c.get(k, 0.0)) for k in _COUNTERS})
                       for name, (alive, c) in self._read().items()}
            deltas = {name: {k: c[k] - self._last.get(name, {}).get(k, 0.0) for k in _COUNTERS}
                      for name, (_, c) in current.items()}
            if seconds <= 0 or not any(d["steps"] > 0 for d in deltas.values()):
                if not self._pending():  # idle (between joins): the time counts for no one
                    self._last_time = now
                return None
            pending = self._pending()
            workers = []
            for name, (alive, counters) in current.items():
                d = deltas[name]
                steps = int(d["steps"])
                if steps:
                    # Synchronous: waiting for the others (the pull of the servers' summed
                    # step; hybrid mode's gradient exchange) is no worker's own time.
                    busy = d["wall"] - (d["pull"] + d["exchange"] if self._sync else 0.0)
                    step_s: float | None = max(busy, 0.0) / steps
                else:
                    step_s = seconds if (alive and pending) else None
                workers.append(WorkerWindow(
                    name, int(counters["steps"]), steps, steps / seconds, step_s,
                    *(d[key] / steps if steps else None for key in ("data", "pull", "push")),
                    alive=alive))
            judge(workers, self.factor)
            window = Window(now - self._start, seconds,
                            sum(w.steps_total for w in workers),
                            sum(w.steps for w in workers), workers)
            self._last = {name: c for name, (_, c) in current.items()}
            self._last_time = now
            self.last_window = window
            self._emit(window)
            return window

    def _emit(self, window: Window) -> None:
        line = format_line(window)
        if self._stream is None:
            logger.info("%s", line)
        else:
            print(line, file=self._stream, flush=True)
        if self._run_dir is None:
            return
        for w in window.workers:
            if not w.alive:
                continue
            task = w.name.replace(" ", "_")
            writer = self._writers.get(task)
            if writer is None:
                writer = self._writers[task] = MetricsWriter(self._run_dir, task)
            writer.write(w.steps_total, **_record(w))


def _record(w: WorkerWindow) -> dict[str, Any]:
    return {"steps_per_s": w.steps_per_s, "step_s": w.step_s, "input_s": w.input_s,
            "pull_s": w.pull_s, "push_s": w.push_s, "slowest": int(w.slowest),
            "straggler": int(w.straggler), "slow_factor": w.slow_factor}
