"""Relays each worker's stdout and stderr line by line, prefixed with its task name.

One reader thread per pipe writes ``[worker 1] <line>`` to the launcher's own stdout or stderr
(like ``mpirun --tag-output`` and TF's ``multi_process_runner``), appends the raw line to the
worker's log file when a log directory is given, and keeps what the failure summary quotes: the
last lines, and the worker's last Python traceback (whole, chained exceptions included, for the
run's journal; the summary quotes its ends) with the time it began (the launcher orders failures
by it, so a traceback printed before a peer's abort names the worker that raised).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Sequence
from typing import IO, TextIO

TAIL_LINES = 20
TRACEBACK_LINES = 40  # the summary quotes the last traceback in at most this many lines
TRACEBACK_KEPT_LINES = 1000  # the journal's copy of it (a longer one loses middle lines)
LINES_AFTER_EXCEPTION = 5  # lines kept after its exception line (chained messages, notes)
TRACEBACK_HEADER = "Traceback (most recent call last):"
# Lines by which Python joins the tracebacks of chained exceptions into one report.
CHAIN_LINES = ("The above exception was the direct cause of the following exception:",
               "During handling of the above exception, another exception occurred:")


class WorkerOutput:
    """Pumps one worker's two pipes until EOF.

    Example:
        >>> out = WorkerOutput("worker 0", sys.stdout, sys.stderr, lock)  # doctest: +SKIP
        >>> out.start(proc.stdout, proc.stderr); out.join(2.0); out.tail()  # doctest: +SKIP
    """

    def __init__(
        self,
        name: str,
        stdout: TextIO | None,
        stderr: TextIO | None,
        write_lock: threading.Lock,
        *,
        log_path: str | None = None,
        header: str | None = None,
        capture: bool = False,
    ) -> None:
        self.name = name
        self._targets = {"stdout": stdout, "stderr": stderr}
        self._write_lock = write_lock
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._traceback_head = ""
        self._traceback: collections.deque[str] = collections.deque(
            maxlen=TRACEBACK_KEPT_LINES - 1)
        self._traceback_omitted = 0
        self._after_exception: int | None = None
        self.traceback_at: float | None = None  # time.monotonic() of the last header
        self._exception_line = ""  # the "SomeError: message" line of the last traceback
        self._chained = False  # a chain line followed the exception: the next header goes on
        self._captured: list[str] | None = [] if capture else None
        self._state_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._open_pipes = 0
        self._log: IO[str] | None = None
        if log_path is not None:
            os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
            # Held open across the reader threads and closed by ``close()`` (the last reader at
            # EOF), so no ``with`` block can scope it.
            self._log = open(log_path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
            if header:
                self._log.write(header + "\n")
                self._log.flush()

    def start(self, stdout_pipe: IO[bytes], stderr_pipe: IO[bytes]) -> None:
        """Starts the two daemon reader threads."""
        self._open_pipes = 2
        for stream, pipe in (("stdout", stdout_pipe), ("stderr", stderr_pipe)):
            thread = threading.Thread(
                target=self._pump,
                args=(stream, pipe),
                name=f"stratax-launch-{self.name.replace(' ', '-')}-{stream}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def join(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds per pipe for both to reach EOF; True if they did.

        A pipe stays open while a grandchild holds it, so callers kill the process group first.
        """
        for thread in self._threads:
            thread.join(timeout)
        return not any(thread.is_alive() for thread in self._threads)

    def close(self) -> None:
        """Closes the log file (done by the last reader at EOF, or if the worker never started)."""
        with self._state_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    def tail(self) -> list[str]:
        """The last lines the worker printed (both streams, in arrival order), without newlines."""
        with self._state_lock:
            return list(self._tail)

    def traceback(self) -> list[str]:
        """The worker's last Python traceback, chained exceptions included: its header, its
        lines (the last ``TRACEBACK_KEPT_LINES`` in all, a gap marked) and a few lines after the
        last exception; ``[]`` if the worker printed none. :func:`abbreviate` shortens it."""
        with self._state_lock:
            if self.traceback_at is None:
                return []
            gap = [_gap(self._traceback_omitted)] if self._traceback_omitted else []
            return [self._traceback_head, *gap, *self._traceback]

    def ends_with_traceback(self) -> bool:
        """True when the worker's output ends with a whole Python traceback, its exception line
        included and at most ``LINES_AFTER_EXCEPTION`` lines after it: it stopped after an
        error, as in JAX's shutdown barrier, rather than handling it and going on. A traceback
        still being printed does not count: the worker was stopped while reporting."""
        with self._state_lock:
            return (self.traceback_at is not None and self._after_exception is not None
                    and self._after_exception <= LINES_AFTER_EXCEPTION)

    def exception_name(self) -> str | None:
        """The class name (without its module) of the exception that ended the worker's last
        traceback, e.g. ``"WorkerUnavailableError"``; ``None`` before a traceback ends."""
        with self._state_lock:
            if not self._exception_line:
                return None
            return self._exception_line.split(":", 1)[0].rsplit(".", 1)[-1]

    def exception_message(self) -> str:
        """The message of the exception that ended the worker's last traceback (``""`` if none)."""
        with self._state_lock:
            return self._exception_line.partition(":")[2].strip()

    def captured(self) -> list[str] | None:
        """Every line printed so far when ``capture=True``, else ``None``."""
        with self._state_lock:
            return None if self._captured is None else list(self._captured)

    def _pump(self, stream: str, pipe: IO[bytes]) -> None:
        prefix = f"[{self.name}] "
        target = self._targets[stream]
        try:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                with self._state_lock:
                    self._tail.append(line)
                    self._keep_traceback(line)
                    if self._captured is not None:
                        self._captured.append(line)
                    if self._log is not None:
                        self._log.write(line + "\n")
                        self._log.flush()
                if target is not None:
                    with self._write_lock:
                        try:
                            target.write(prefix + line + "\n")
                            target.flush()
                        except (OSError, ValueError):
                            # The launcher's own stream is gone (closed pipe); keep draining so
                            # the child never blocks on a full pipe.
                            target = None
        finally:
            pipe.close()
            with self._state_lock:
                self._open_pipes -= 1
                last = self._open_pipes == 0
            if last:
                self.close()

    def _keep_traceback(self, line: str) -> None:
        """Called with the state lock held, for every line in arrival order.

        Keeps the header of the last traceback, its last lines (the exception is at the end)
        and a few lines after the exception line; what follows belongs to the tail.
        """
        if line.startswith(TRACEBACK_HEADER):
            self._after_exception = None
            self._exception_line = ""
            if self._chained:  # the next exception of a chain: the same report goes on
                self._chained = False
                self._keep_traceback_line(line)
                return
            self.traceback_at = time.monotonic()
            self._traceback_head = line
            self._traceback.clear()
            self._traceback_omitted = 0
            return
        if self.traceback_at is None:
            return
        if self._after_exception is not None:
            if line.strip() in CHAIN_LINES:
                self._chained = True
            elif line.strip():
                self._chained = False
            self._after_exception += 1
            if self._after_exception > LINES_AFTER_EXCEPTION:
                return
        elif line and not line[0].isspace():
            self._after_exception = 0  # the "SomeError: message" line ends the frames
            self._exception_line = line
        self._keep_traceback_line(line)

    def _keep_traceback_line(self, line: str) -> None:
        if len(self._traceback) == self._traceback.maxlen:
            self._traceback_omitted += 1
        self._traceback.append(line)


def abbreviate(traceback: Sequence[str], max_lines: int = TRACEBACK_LINES) -> list[str]:
    """``traceback`` in at most ``max_lines`` lines: its header, a line saying how many were
    left out, and its last lines (where the exception is)."""
    if len(traceback) <= max_lines:
        return list(traceback)
    last = max_lines - 2
    return [traceback[0], _gap(len(traceback) - 1 - last), *traceback[-last:]]


def _gap(omitted: int) -> str:
    return f"  ... ({omitted} line(s) left out; see the full output)"
