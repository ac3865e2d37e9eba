"""How a launch ended: ``TaskFailure`` (where a start of the group failed), ``LaunchResult``,
and the summary ``stratax launch`` prints (which worker, how, its traceback abbreviated).
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Mapping

from stratax._src.launch.config import LaunchConfig
from stratax._src.launch.membership import Membership
from stratax._src.launch.output import abbreviate
from stratax._src.launch.worker_group import Worker, describe_returncode

EXIT_TIMEOUT = 124  # like coreutils `timeout`


@dataclasses.dataclass(frozen=True)
class TaskFailure:
    """The worker where the failure of one start of the group began (see
    ``WorkerGroup.root_cause``), with its output: the last lines and its last traceback."""

    name: str  # the task as TF_CONFIG names it: "chief 0", "worker 1", "ps 2"
    file_name: str  # the same in file names and events: "chief_0", "ps_2"
    global_rank: int
    local_rank: int
    pid: int
    returncode: int  # as subprocess reports it: negative = killed by that signal
    restart_count: int
    tail: tuple[str, ...]
    # The worker's last Python traceback, whole, if it printed one (the summary abbreviates it).
    traceback: tuple[str, ...] = ()
    # The peer that named this worker as silent (hung, frozen, lost); ``traceback`` then holds
    # that peer's words (its traceback, or the line JAX's coordination service printed).
    reported_by: str | None = None

    @property
    def exit_code(self) -> int | None:
        """The worker's exit code, or ``None`` when a signal killed it."""
        return self.returncode if self.returncode >= 0 else None

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"`` etc. when a signal killed the worker, else ``None``."""
        if self.returncode >= 0:
            return None
        return describe_returncode(self.returncode).removeprefix("signal ")

    def describe(self) -> str:
        """One line: who failed, how, and on which start of the group."""
        how = (f"stopped answering ({self.reported_by} reported it; the teardown then ended it "
               f"with {describe_returncode(self.returncode)})" if self.reported_by
               else f"failed with {describe_returncode(self.returncode)}")
        return (f"{self.name} (local rank {self.local_rank}, pid {self.pid}) {how} "
                f"(restart {self.restart_count})")


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """How a launched group ended.

    ``exit_code`` is what ``stratax launch`` exits with: 0 when every worker exited 0; the first
    failing worker's exit code (or 128 + signal number) after the last allowed restart; 1 when
    it stops on a global batch that does not split over the replicas; 124 on ``timeout``;
    128 + signum when the launcher itself was interrupted.

    Example:
        >>> result = launch([sys.executable, "train.py"], nproc_per_node=2)  # doctest: +SKIP
        >>> result.ok or print(result.summary)  # doctest: +SKIP
    """

    exit_code: int
    restarts: int
    failures: tuple[TaskFailure, ...]
    timed_out: bool
    interrupted_by: str | None
    elapsed: float
    summary: str
    outputs: Mapping[int, list[str]] | None = None
    workers: int = 0  # workers of the last start (an elastic launch may have dropped some)

    @property
    def ok(self) -> bool:
        """True when every worker of the final start exited with code 0."""
        return self.exit_code == 0

    @property
    def failure(self) -> TaskFailure | None:
        """The root cause of the last failed start, if any."""
        return self.failures[-1] if self.failures else None


def ending(workers: int, restart: int, failures: list[TaskFailure], config: LaunchConfig, *,
           signum: int | None, timed_out: bool, members: Membership | None,
           split: tuple[int, int] | None) -> tuple[int, str]:
    """``(exit code, summary)`` of a launch whose last start, of ``workers`` workers, ended
    after ``restart`` restarts: by the signal ``signum`` to the launcher, by its timeout, by
    the last of ``failures`` (``split``: a global batch that did not split), or successfully
    (``LaunchResult`` says what the exit code means)."""
    signame = signal.Signals(signum).name if signum else None
    failure = failures[-1] if failures and failures[-1].restart_count == restart else None
    if signame is not None:
        exit_code = 128 + signum
        text = (f"interrupted by {signame}; sent SIGTERM to {workers} worker(s) and "
                f"stopped them.")
    elif timed_out:
        exit_code = EXIT_TIMEOUT
        text = (f"the group did not finish within the timeout of "
                f"{config.timeout:g} s (wall clock, restarts included); stopped "
                f"{workers} worker(s).")
    elif failure is not None:
        exit_code = failure.returncode if failure.returncode > 0 else 128 - failure.returncode
        text = failure_text(failure, config, restart)
        if split is not None and members is not None:
            text = f"{batch_split_stop(split, members)}\n{text}"
            # Every worker raised that error (exit 1); the one named may have been stopped by
            # the teardown while it exited, which says nothing about the error.
            exit_code = 1
    else:
        exit_code = 0
        text = f"all {workers} worker(s) exited with code 0 ({restart} restart(s))."
        if members is not None and members.dropped:
            text = text[:-1] + (f"; worker slot(s) {members.dropped} were dropped after "
                                "failing past their restarts.")
        if members is not None and members.came_back:
            text = text[:-1] + (f"; worker slot(s) {members.came_back} were dropped and "
                                "rejoined.")
    return exit_code, text


def failure_of(worker: Worker, restart: int,
                reporter: tuple[Worker, list[str]] | None = None) -> TaskFailure:
    """``worker``'s failure; ``reporter``: the peer that named it as silent, and its words."""
    return TaskFailure(
        name=worker.spec.name, file_name=worker.spec.file_name,
        global_rank=worker.spec.global_rank,
        local_rank=worker.spec.local_rank, pid=worker.pid,
        returncode=int(worker.returncode if worker.returncode is not None else -9),
        restart_count=restart, tail=tuple(worker.output.tail()),
        traceback=tuple(reporter[1] if reporter else worker.output.traceback()),
        reported_by=reporter[0].spec.name if reporter else None,
    )


def batch_split_stop(split: tuple[int, int], members: Membership) -> str:
    """Why a failure on the batch split ends the launch: no restart can fix it."""
    batch, replicas = split
    where = ("no number of workers between the minimum and the slots left splits it"
             if members.minimum is not None else "a restart would fail the same way")
    return (f"stopped: the workers fail with \"Global batch size {batch} does not split over "
            f"{replicas} replicas\" and {where}; pass a global batch that is a multiple of "
            "the replicas of every worker count the launch may use.")


def failure_text(failure: TaskFailure, config: LaunchConfig, restarts: int) -> str:
    lines = [
        f"{failure.describe()}, the first task to fail; the other workers were stopped"
        + (f" (gave up after {restarts} restart(s))." if config.max_restarts else "."),
    ]
    if failure.reported_by:
        lines.append(f"What {failure.reported_by} said:")
        lines.extend(f"  [{failure.reported_by}] {line}" for line in abbreviate(failure.traceback))
    elif failure.traceback:
        lines.append(f"{failure.name}'s last Python traceback:")
        lines.extend(f"  [{failure.name}] {line}" for line in abbreviate(failure.traceback))
    elif failure.tail:
        lines.append(f"Last {len(failure.tail)} line(s) of {failure.name}'s output:")
        lines.extend(f"  [{failure.name}] {line}" for line in failure.tail)
    else:
        lines.append(f"{failure.name} printed nothing.")
    if config.log_dir is not None:
        log_path = os.path.join(config.log_dir, f"{failure.file_name}.log")
        lines.append(f"Full log: {log_path}")
    return "\n".join(lines)
