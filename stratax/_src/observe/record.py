"""Any process reports scalars to the run directory: ``record(step=..., loss=..., step_s=...)``.

Each process appends to its own file, ``<run_dir>/metrics/<task>.jsonl``, one JSON object per
call: ``{"t": <unix time>, "task": "worker_1", "step": 120, "loss": 0.31, ...}``. One file per
process means no locking between processes and no network: the dashboard (or anyone) tails the
files. With no run directory configured, ``record`` does nothing and returns ``False`` (like
``tf.summary`` without a default writer), so instrumented code runs unchanged outside an
observed run.

Scalar names the dashboard understands (any other name is shown as a metric):

| name | meaning |
| --- | --- |
| ``step_s`` | seconds per training step (mean over the report's window) |
| ``samples_per_s`` | samples this process trained per second |
| ``input_s`` | seconds per step spent fetching the next batch |
| ``collective_s`` | seconds per step in all-reduce (estimated, see ``WorkerMetrics``) |
| ``pull_s``, ``push_s`` | seconds per step pulling variables / pushing gradients (ps) |
| ``requests_per_s``, ``bytes_per_s`` | load of a parameter-server shard (task ``ps_<i>``) |
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

from stratax._src.observe.run_dir import PathLike, metrics_path, resolve_run_dir, resolve_task_name

RESERVED = ("t", "task", "step")


class MetricsWriter:
    """Appends records of one task to ``<run_dir>/metrics/<task>.jsonl`` (thread-safe).

    Example:
        >>> writer = MetricsWriter("/tmp/run", "worker_0")  # doctest: +SKIP
        >>> writer.write(step=10, loss=0.5, step_s=0.012)  # doctest: +SKIP
    """

    def __init__(self, run_dir: PathLike, task: str | None = None) -> None:
        self.task = resolve_task_name(task)
        self.path: Path = metrics_path(run_dir, self.task)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open; close()

    def write(self, step: int | None = None, **scalars: float) -> None:
        """Appends one record; values must be numbers (``None`` and non-finite become ``null``).

        Raises:
            ValueError: a reserved name (``t``, ``task``) among the scalars, or a closed writer.
            TypeError: a value that is not a number, naming it.
        """
        entry: dict[str, object] = {"t": time.time(), "task": self.task}
        if step is not None:
            entry["step"] = int(step)
        for name, value in scalars.items():
            if name in RESERVED:
                raise ValueError(f"{name!r} is reserved in a metrics record; rename the scalar.")
            entry[name] = _number(name, value)
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock:
            if self._file.closed:
                raise ValueError(f"MetricsWriter for {self.path} is closed; create a new one.")
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        """Closes the file (idempotent)."""
        with self._lock:
            self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _number(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int):  # bool included: stays an exact integer
        return int(value)
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(
            f"Metric {name!r} must be a number, got {value!r} ({type(value).__name__})."
        ) from None
    return number if math.isfinite(number) else None


_writers: dict[tuple[Path, str], MetricsWriter] = {}
_writers_lock = threading.Lock()


def writer_for(run_dir: PathLike | None = None,
               task: str | None = None) -> MetricsWriter | None:
    """The shared writer of this process for ``run_dir``/``task`` (resolved), or ``None``.

    ``None`` when no run directory is given and ``STRATAX_RUN_DIR`` is unset.
    """
    directory = resolve_run_dir(run_dir)
    if directory is None:
        return None
    name = resolve_task_name(task)
    key = (directory.resolve(), name)
    with _writers_lock:
        writer = _writers.get(key)
        if writer is None or writer._file.closed:
            writer = _writers[key] = MetricsWriter(directory, name)
        return writer


def record(step: int | None = None, *, run_dir: PathLike | None = None,
           task: str | None = None, **scalars: float) -> bool:
    """Reports scalars of this process at ``step`` to the run directory.

    Args:
        step: the training step the values belong to (optional).
        run_dir: the run directory; default ``$STRATAX_RUN_DIR`` (set by
            ``stratax launch --dashboard`` for every worker).
        task: this process's name; default ``$STRATAX_TASK_NAME``, else ``worker_<rank>`` under
            ``stratax launch``, else ``<type>_<index>`` from ``TF_CONFIG``, else ``main``.
        **scalars: numbers, e.g. ``loss=0.3, pull_s=0.002``.

    Returns:
        ``True`` when written, ``False`` when no run directory is configured.

    Example:
        >>> sx.observe.record(step=100, loss=0.25, push_s=0.004)  # doctest: +SKIP
    """
    writer = writer_for(run_dir, task)
    if writer is None:
        return False
    writer.write(step, **scalars)
    return True


def close_all() -> None:
    """Closes every shared writer of this process (tests; the files stay)."""
    with _writers_lock:
        for writer in _writers.values():
            writer.close()
        _writers.clear()
