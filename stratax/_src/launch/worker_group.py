"""Starts one group of worker processes, reports their exits in order, and tears them down.

Each worker runs in its own session (``start_new_session=True``), so it leads a process group
that also holds whatever it spawns; teardown signals whole groups, grandchildren included.
A waiter thread per worker records exits in the order they happen, and
:meth:`WorkerGroup.root_cause` uses those times, and the time each worker began printing its
last Python traceback, to name the task where a failure *started* rather than one that died
because a peer did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO

from stratax._src.launch.child_env import WorkerSpec
from stratax._src.launch.output import WorkerOutput

logger = logging.getLogger(__name__)

# How a worker ends when the teardown stops it: killed by SIGTERM or SIGKILL, or exiting with
# 128 + SIGTERM from a handler.
_TEARDOWN_STATUSES = (-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM)
# The error a worker raises when a collective finds a peer gone: the peer failed first.
_PEER_LOST = "WorkerUnavailableError"
# How JAX's coordination service words a peer's missed heartbeats (the process ids follow, one
# per line) when it aborts the other processes.
_JAX_HEARTBEAT_LOSS = "The following tasks are unhealthy (stopped sending heartbeats):"


def _unhealthy_process_ids(lines: Sequence[str]) -> set[int]:
    """The process ids listed after JAX's last heartbeat-loss line in ``lines``."""
    ids: set[int] = set()
    for line in lines:
        if _JAX_HEARTBEAT_LOSS in line:
            ids = set()
        elif ids is not None and line.strip().isdigit():
            ids.add(int(line.strip()))
    return ids


@dataclasses.dataclass
class Worker:
    """A started child: its spec, process, output relay and exit status (once known)."""

    spec: WorkerSpec
    process: subprocess.Popen[bytes]
    output: WorkerOutput
    exited: threading.Event = dataclasses.field(default_factory=threading.Event)
    returncode: int | None = None
    exited_at: float | None = None  # time.monotonic() when the exit was seen

    @property
    def failed_at(self) -> float:
        """When this worker first showed its failure: its last traceback began, or it exited."""
        times = [t for t in (self.output.traceback_at, self.exited_at) if t is not None]
        return min(times) if times else float("inf")

    @property
    def pid(self) -> int:
        """The child's pid, which is also its process-group id."""
        return self.process.pid


def describe_returncode(returncode: int) -> str:
    """``exit code 3`` or ``signal SIGKILL`` for a :class:`subprocess.Popen` return code."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"


def _has_exited(pid: int) -> bool:
    """True once child ``pid`` has exited, even if its waiter thread has not reaped it yet
    (``WNOWAIT`` leaves the zombie to that thread)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # already reaped


class WorkerGroup:
    """The processes of one start of the group (a restart makes a new ``WorkerGroup``).

    Example:
        >>> group = WorkerGroup.start(cmd, specs, stdout=None, stderr=None)  # doctest: +SKIP
        >>> first = group.next_exit(timeout=1.0)  # doctest: +SKIP
        >>> group.teardown(grace_period=5.0)  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.workers: list[Worker] = []
        self._exits: queue.Queue[Worker] = queue.Queue()
        self._waiters: list[threading.Thread] = []
        self._torn_down = False
        self._signalled_at: float | None = None  # when teardown first signalled the group
        self._dead_before_signal: set[int] = set()  # pids already exited (maybe unreaped) then
        self._start_args: tuple[Any, ...] = ()  # what `start` was given, for restart_one

    @classmethod
    def start(
        cls,
        cmd: Sequence[str],
        specs: Sequence[WorkerSpec],
        *,
        stdout: TextIO | None,
        stderr: TextIO | None,
        log_dir: str | None = None,
        restart_count: int = 0,
        capture_output: bool = False,
        cwd: str | None = None,
    ) -> WorkerGroup:
        """Starts one child per spec; on a start error, stops those already started.

        Raises:
            ValueError: when ``cmd[0]`` cannot be executed (not found, not executable).
        """
        group = cls()
        write_lock = threading.Lock()
        group._start_args = (cmd, stdout, stderr, write_lock, log_dir, capture_output, cwd)
        try:
            for spec in specs:
                group._start_one(cmd, spec, stdout, stderr, write_lock, log_dir,
                                 restart_count, capture_output, cwd)
        except BaseException:
            group.teardown(grace_period=0.0)
            raise
        return group

    def _start_one(
        self,
        cmd: Sequence[str],
        spec: WorkerSpec,
        stdout: TextIO | None,
        stderr: TextIO | None,
        write_lock: threading.Lock,
        log_dir: str | None,
        restart_count: int,
        capture_output: bool,
        cwd: str | None,
    ) -> None:
        log_path = None
        if log_dir is not None:
            log_path = os.path.join(log_dir, f"{spec.file_name}.log")
        output = WorkerOutput(
            spec.name, stdout, stderr, write_lock, log_path=log_path, capture=capture_output,
            header=f"--- stratax launch: {spec.name}, restart {restart_count}, "
                   f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---",
        )
        try:
            process = subprocess.Popen(
                list(cmd), env=dict(spec.env), cwd=cwd, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as err:
            output.close()
            raise ValueError(
                f"Cannot start {spec.name} with command {list(cmd)!r}: {err.strerror} "
                f"({cmd[0]!r}). Pass an existing executable, e.g. [sys.executable, 'train.py']."
            ) from err
        if process.stdout is None or process.stderr is None:  # pragma: no cover - PIPE given
            raise RuntimeError(f"{spec.name} was started without output pipes.")
        output.start(process.stdout, process.stderr)
        worker = Worker(spec, process, output)
        self.workers.append(worker)
        waiter = threading.Thread(
            target=self._wait, args=(worker,), name=f"stratax-launch-wait-{worker.pid}",
            daemon=True,
        )
        waiter.start()
        self._waiters.append(waiter)
        logger.debug("Started %s as pid %d: %s", spec.name, worker.pid, list(cmd))

    def restart_one(self, worker: Worker, restart_count: int) -> Worker:
        """Starts ``worker``'s spec again (same command and environment) in place of the
        exited ``worker``; returns the new one."""
        if not worker.exited.is_set():
            raise RuntimeError(f"{worker.spec.name} (pid {worker.pid}) is still running.")
        cmd, stdout, stderr, write_lock, log_dir, capture_output, cwd = self._start_args
        index = self.workers.index(worker)
        self._start_one(cmd, worker.spec, stdout, stderr, write_lock, log_dir, restart_count,
                        capture_output, cwd)
        self.workers[index] = self.workers.pop()
        return self.workers[index]

    def _wait(self, worker: Worker) -> None:
        worker.returncode = worker.process.wait()
        worker.exited_at = time.monotonic()
        worker.exited.set()
        self._exits.put(worker)

    def next_exit(self, timeout: float) -> Worker | None:
        """The next worker to exit, in exit order, or ``None`` if none exits within ``timeout``."""
        try:
            return self._exits.get(timeout=timeout)
        except queue.Empty:
            return None

    def root_cause(self) -> Worker | None:
        """The worker where the failure started.

        Candidates are the workers that failed on their own, plus those the teardown stopped
        (SIGTERM or SIGKILL after it signalled them) whose output ends with a whole Python
        traceback: they had failed and were stuck, e.g. in JAX's shutdown barrier. Other workers
        the teardown stopped are victims, not causes, also one stopped while still printing a
        traceback (it was reporting the peer's failure). Of the candidates, the one whose failure
        showed first wins: the earlier of the time it began printing its last traceback and the
        time it exited. So a worker that printed a traceback is named before peers that aborted
        (SIGABRT from JAX's coordination service) because it stopped answering. A worker that
        ended on stratax's ``WorkerUnavailableError`` (a collective found a peer gone) names a
        peer as the cause, so it is a candidate only when no other is: a peer killed by a
        signal may be reaped after the survivor has already printed its traceback.
        """
        failed = [w for w in self.workers if w.returncode not in (None, 0)]
        candidates = [w for w in failed
                      if not self._stopped_by_teardown(w) or w.output.ends_with_traceback()]
        first_causes = [w for w in candidates if w.output.exception_name() != _PEER_LOST]
        pool = first_causes or candidates or failed
        return min(pool, key=lambda w: w.failed_at) if failed else None

    def named_as_lost(self, reporter: Worker) -> tuple[Worker, list[str]] | None:
        """The one other worker of the group that ``reporter`` says stopped answering, with the
        lines that say so, or ``None``. A hung or frozen worker prints nothing: its peers' word
        is all there is, either stratax's ``WorkerUnavailableError`` naming it, or JAX's
        coordination service listing the process ids that "stopped sending heartbeats" as it
        aborts the peer."""
        if reporter.output.exception_name() == _PEER_LOST:
            message = reporter.output.exception_message()
            named = [w for w in self.workers if w is not reporter
                     and re.search(re.escape(w.spec.name) + r"(?!\d)", message)]
            lines = reporter.output.traceback()
        else:
            lines = reporter.output.tail()
            ranks = _unhealthy_process_ids(lines)
            named = [w for w in self.workers if w is not reporter and w.spec.global_rank in ranks]
            lines = [f"JAX's coordination service: {_JAX_HEARTBEAT_LOSS} "
                     + ", ".join(map(str, sorted(ranks)))]
        return (named[0], lines) if len(named) == 1 else None

    def _stopped_by_teardown(self, worker: Worker) -> bool:
        signalled = self._signalled_at
        return (signalled is not None and worker.pid not in self._dead_before_signal
                and worker.exited_at is not None
                and worker.exited_at >= signalled
                and worker.returncode in _TEARDOWN_STATUSES)

    def all_exited(self) -> bool:
        """True once every worker has exited (whatever its status)."""
        return all(worker.exited.is_set() for worker in self.workers)

    def signal_all(self, signum: int) -> None:
        """Sends ``signum`` to every worker's process group (gone groups are skipped)."""
        # A stopped (SIGSTOP) worker acts on SIGTERM only once it is resumed.
        signals = (signum, signal.SIGCONT) if signum == signal.SIGTERM else (signum,)
        for worker in self.workers:
            for sent in signals:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(worker.pid, sent)

    def teardown(self, grace_period: float, force: threading.Event | None = None) -> None:
        """Stops every worker and its descendants; idempotent.

        Sends SIGTERM to each process group, waits up to ``grace_period`` seconds for the
        workers to exit (a set ``force`` event cuts the wait short), then sends SIGKILL to
        every group so grandchildren that ignored SIGTERM go too, and drains the output.
        """
        if self._torn_down:
            return
        self._torn_down = True
        if not self.all_exited():
            self._dead_before_signal = {w.pid for w in self.workers if _has_exited(w.pid)}
            self._signalled_at = time.monotonic()
            self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_period
        for worker in self.workers:
            while not worker.exited.is_set() and time.monotonic() < deadline:
                if force is not None and force.is_set():
                    break
                worker.exited.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        self.signal_all(signal.SIGKILL)
        for worker in self.workers:
            if not worker.exited.wait(10.0):
                logger.warning("%s (pid %d) did not exit after SIGKILL.", worker.spec.name,
                               worker.pid)
        for waiter in self._waiters:
            waiter.join(1.0)
        for worker in self.workers:
            if not worker.output.join(2.0):
                logger.warning("Output of %s still open after teardown; a descendant may "
                               "hold its pipe.", worker.spec.name)
