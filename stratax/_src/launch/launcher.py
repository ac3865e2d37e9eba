"""``Launcher``: runs a command as a local group of workers, with restarts, timeout and teardown.

The policy, like torchrun's elastic agent kept small: the group lives and dies together. When
any worker exits non-zero or dies by a signal, the others are stopped (SIGTERM, a grace period,
then SIGKILL, by process group) and the group is restarted as a whole up to ``max_restarts``
times (fresh ports, ``STRATAX_RESTART_COUNT`` + 1). A wall-clock ``timeout`` and SIGINT/SIGTERM
to the launcher stop the group the same way: SIGTERM is forwarded and escalated to SIGKILL after
``grace_period`` seconds, so a worker that ignores SIGTERM never keeps the launcher waiting. An
elastic launch (``min_nproc_per_node``) drops a worker that keeps failing, goes on with the
rest and tries it again at a later restart (see ``membership``); a global batch that does not
split over the replicas ends a launch at once, or an elastic one picks a worker count that
splits it. The summary (``outcome``) names the worker where the failure began and quotes its
traceback (docs/failures-and-signals.md). Worker failures are *returned* in a
:class:`LaunchResult`; only problems that stop the launcher from starting workers raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import TextIO

from stratax._src.core import env as env_names
from stratax._src.launch.child_env import build_worker_specs
from stratax._src.launch.config import Address, LaunchConfig
from stratax._src.launch.membership import Membership, batch_split_error
from stratax._src.launch.network import (
    LOOPBACK,
    ensure_port_free,
    reserve_free_ports,
    wait_until_reachable,
)
from stratax._src.launch.outcome import LaunchResult, TaskFailure, ending, failure_of
from stratax._src.launch.worker_group import Worker, WorkerGroup
from stratax._src.observe.events import EventLog

logger = logging.getLogger(__name__)

_POLL_SECONDS = 0.1


class Launcher:
    """State of one ``launch()`` call: the current group, and signals received."""

    def __init__(self, cmd: list[str], config: LaunchConfig, base_env: dict[str, str], *,
                 cwd: str | None, capture_output: bool, stdout: TextIO | None,
                 stderr: TextIO | None, events: EventLog | None = None) -> None:
        self._cmd = cmd
        self._config = config
        self._base_env = base_env
        self._cwd = cwd
        self._capture = capture_output
        self._stdout = stdout
        self._stderr = stderr
        self._signum: int | None = None
        self._stop = threading.Event()  # a signal asked the launcher to end
        self._force = threading.Event()  # a second signal: skip the grace period
        self._group: WorkerGroup | None = None
        self._events = events
        self._task_restarts = 0  # single parameter-server tasks restarted (see _monitor)

    def run(self, handle_signals: bool) -> LaunchResult:
        started = time.monotonic()
        with self._signals_installed(handle_signals):
            try:
                result = self._run(started)
                if self._events is not None:
                    self._events.append("end", exit_code=result.exit_code, message=result.summary)
                return result
            finally:
                if self._group is not None:  # only on an exception; else already torn down
                    self._group.teardown(0.0)

    def _run(self, started: float) -> LaunchResult:
        deadline = None if self._config.timeout is None else started + self._config.timeout
        members = Membership(self._config.nproc_per_node, self._config.min_nproc_per_node,
                             self._config.max_restarts)
        failures: list[TaskFailure] = []
        restart = 0
        while True:
            config = dataclasses.replace(self._config, nproc_per_node=members.size)
            coordinator, ports = self._prepare(config, deadline)
            if self._stop.is_set():
                return self._result(started, restart, failures, interrupted=True)
            specs = build_worker_specs(config, coordinator, restart, self._base_env, ports)
            self._group = group = WorkerGroup.start(
                self._cmd, specs, stdout=self._stdout, stderr=self._stderr,
                log_dir=config.log_dir, restart_count=restart,
                capture_output=self._capture, cwd=self._cwd,
            )
            if self._events is not None:
                self._events.append("start", restart=restart, pids=[w.pid for w in group.workers],
                                    tasks=[w.spec.file_name for w in group.workers],
                                    ranks=[w.spec.global_rank for w in group.workers])
            outcome, failed = self._monitor(group, deadline)
            if outcome == "timeout":
                self._notice(f"timeout of {config.timeout:g} s reached; stopping "
                             f"{len(group.workers)} worker(s).")
            group.teardown(config.grace_period, self._force)
            split: tuple[int, int] | None = None  # the group's own failure: see membership
            if outcome == "failed" and failed is not None:
                cause = group.root_cause() or failed
                lost = group.named_as_lost(cause)
                failures.append(failure_of(lost[0], restart, reporter=(cause, lost[1])) if lost
                                else failure_of(cause, restart))
                self._record_failure(failures[-1])
                split = batch_split_error(failures[-1].traceback or failures[-1].tail)
                step = (members.after_batch_split(*split) if split
                        else members.after_failure(failures[-1].local_rank, restart))
                if step != "stop" and not self._stop.is_set():
                    restart += 1
                    self._restarting(failures[-1], members, step, restart, split)
                    continue
            return self._result(started, restart, failures, timed_out=outcome == "timeout",
                                interrupted=self._stop.is_set(), members=members,
                                split=split)

    def _restarting(self, failure: TaskFailure, members: Membership, step: str,
                    restart: int, split: tuple[int, int] | None) -> None:
        """Tells the user, and the run's journal, why the group starts again and with whom."""
        if split is not None and members.batch is not None:
            batch, per_worker = members.batch
            text = (f"restart {restart}: the global batch {batch} does not split over "
                    f"{split[1]} replicas; the group restarts with {members.size} worker(s) "
                    f"({members.size * per_worker} replicas), from its last backup")
        elif step == "drop":
            text = (f"worker slot {members.dropped[-1]} failed "
                    f"{members.failures(members.dropped[-1])} time(s) and is dropped; the group "
                    f"restarts with {members.size} worker(s) (at least "
                    f"{members.minimum}), from its last backup")
        elif members.minimum is not None:
            slot = members.last_failed
            text = (f"restart {restart} (worker slot {slot}: failure {members.failures(slot)} "
                    f"of {self._config.max_restarts} allowed)")
        else:
            text = f"restart {restart} of {self._config.max_restarts}"
        if members.rejoined:
            text += (f"; worker slot(s) {members.rejoined} rejoin: the group restarts with "
                     f"{members.size} worker(s) (at most {members.maximum})")
        if members.waiting:
            text += (f"; worker slot(s) {members.waiting} wait, as the batch would not split "
                     "over them")
        self._notice(f"{failure.describe()}; restarting the group ({text}).")
        if self._events is not None:
            self._events.append("restart", restart=restart, workers=members.size, message=text)

    def _prepare(self, config: LaunchConfig,
                 deadline: float | None) -> tuple[Address, list[int] | None]:
        """Coordinator address and (single node) TF_CONFIG ports for the next start."""
        fixed = config.coordinator_address
        if config.nnodes == 1:
            if fixed is None:
                ports = reserve_free_ports(config.nproc_per_node)
                return Address(LOOPBACK, ports[0]), ports
            ensure_port_free(fixed)
            others = [p for p in reserve_free_ports(config.nproc_per_node) if p != fixed.port]
            return fixed, [fixed.port, *others[:config.nproc_per_node - 1]]
        if fixed is None:  # pragma: no cover - LaunchConfig requires it for nnodes > 1
            raise ValueError("nnodes > 1 requires a coordinator address.")
        if config.node_rank == 0:
            ensure_port_free(fixed)
        else:
            wait = config.coordinator_wait
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            wait_until_reachable(fixed, wait, stop=self._stop)
        return fixed, None

    def _monitor(self, group: WorkerGroup,
                 deadline: float | None) -> tuple[str, Worker | None]:
        """Waits for the group's end: ``success``, ``failed`` + worker, ``timeout``, ``signal``."""
        finished: set[int] = set()  # pids that exited with code 0
        while True:
            if self._stop.is_set():
                return "signal", None
            wait = _POLL_SECONDS
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    return "timeout", None
            worker = group.next_exit(wait)
            if worker is None:
                continue
            if worker.returncode != 0:
                if self._restart_ps_task(group, worker):
                    continue
                return "failed", worker
            finished.add(worker.pid)
            if _ps_role(worker) == "chief":
                self._await_tasks_after_chief(group)
                return "success", None
            if all(w.pid in finished for w in group.workers):
                return "success", None

    def _await_tasks_after_chief(self, group: WorkerGroup) -> None:
        """A parameter-server job ends with its chief: the chief asked its tasks to exit, so
        they get the grace period to do it (teardown stops the rest); none is restarted, since
        no chief would ever claim it (a task restarted after the chief would wait for one)."""
        deadline = time.monotonic() + self._config.grace_period
        while not group.all_exited() and not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                running = [w for w in group.workers if not w.exited.is_set()]
                self._notice(f"the chief finished; stopping {len(running)} task(s) still "
                             "running after the grace period.")
                return
            group.next_exit(min(remaining, _POLL_SECONDS))

    def _restart_ps_task(self, group: WorkerGroup, worker: Worker) -> bool:
        """Under ``--ps``, restarts a failed ``worker`` or ``ps`` task alone (same address and
        TF_CONFIG), up to ``max_restarts`` times: the running chief takes it back (see
        docs/parameter_server.md, Failures). Returns False for the chief or when none is left."""
        role = _ps_role(worker)
        if (role not in ("worker", "ps") or self._task_restarts >= self._config.max_restarts
                or self._stop.is_set()):
            return False
        self._task_restarts += 1
        failure = failure_of(worker, self._task_restarts)
        self._record_failure(failure)
        self._notice(f"{failure.describe()}; restarting {worker.spec.name} alone (task restart "
                     f"{self._task_restarts} of {self._config.max_restarts}).")
        group.restart_one(worker, self._task_restarts)
        return True

    def _result(self, started: float, restart: int, failures: list[TaskFailure], *,
                timed_out: bool = False, interrupted: bool = False,
                members: Membership | None = None,
                split: tuple[int, int] | None = None) -> LaunchResult:
        group, self._group = self._group, None
        workers = group.workers if group is not None else []
        signum = self._signum if interrupted else None
        signame = signal.Signals(signum).name if signum else None
        exit_code, text = ending(len(workers), restart, failures, self._config, signum=signum,
                                 timed_out=timed_out, members=members, split=split)
        outputs = None
        if self._capture:
            outputs = {w.spec.global_rank: w.output.captured() or [] for w in workers}
        return LaunchResult(
            exit_code=exit_code, restarts=restart, failures=tuple(failures),
            timed_out=timed_out and signame is None, interrupted_by=signame,
            elapsed=time.monotonic() - started, summary="stratax launch: " + text,
            outputs=outputs, workers=len(workers),
        )

    def _record_failure(self, failure: TaskFailure) -> None:
        if self._events is not None:
            self._events.failure(restart=failure.restart_count, task=failure.file_name,
                                 rank=failure.global_rank, pid=failure.pid,
                                 returncode=failure.returncode, message=failure.describe(),
                                 tail=failure.tail, traceback=failure.traceback)

    def _notice(self, message: str) -> None:
        """Tells the user what the launcher does (restart, timeout) on its stderr."""
        logger.debug(message)
        if self._stderr is not None:
            with contextlib.suppress(OSError, ValueError):
                self._stderr.write(f"[stratax launch] {message}\n")
                self._stderr.flush()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signum is None:
            self._signum = signum
            self._stop.set()
        else:
            self._force.set()

    @contextlib.contextmanager
    def _signals_installed(self, enabled: bool) -> Iterator[None]:
        if not enabled:
            yield
            return
        if threading.current_thread() is not threading.main_thread():
            logger.warning("launch(handle_signals=True) outside the main thread: signals are "
                           "not handled.")
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _ps_role(worker: Worker) -> str | None:
    """``chief``, ``worker`` or ``ps`` for a task of a ``--workers/--ps`` job, else ``None``."""
    if not worker.spec.env.get(env_names.STRATAX_PS_ROLES):
        return None
    return worker.spec.task_type
