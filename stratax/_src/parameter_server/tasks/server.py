"""``sx.Server``: a generic ``ps`` or ``worker`` task (TensorFlow's ``tf.distribute.Server``).

Workers and parameter servers need no user code::

    sx.Server(resolver.cluster_spec(), job_name="ps", task_index=0).join()

or ``stratax server`` (reads TF_CONFIG). The server listens on the address the cluster spec
gives its task (127.0.0.1 stays loopback; any other address needs ``STRATAX_PS_TOKEN``) and
returns from ``join()`` when the coordinator has finished and asked it to stop, or when no
chief has been heard for ``chief_timeout_seconds`` (see ``tasks.ownership``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from stratax._src.cluster.cluster_spec import ClusterSpec, parse_address
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.parameter_server.tasks import cluster_check, compute_threads, ownership
from stratax._src.parameter_server.transport import handshake_log, rpc, rpc_server, wire

logger = logging.getLogger(__name__)

SERVED_JOBS = ("ps", "worker")


class Server:
    """Serves one ``ps`` or ``worker`` task of a cluster until the coordinator stops it.

    Args:
      server_or_cluster_def: A ``ClusterSpec``, a ``{job: [addresses]}`` dict or a cluster
        resolver (whose task type and index are then the defaults).
      job_name: ``"ps"`` or ``"worker"``.
      task_index: Index of this task in its job.
      protocol: ``"grpc"`` (accepted for TensorFlow compatibility; clients on the same host
        use the server's Unix socket instead unless ``STRATAX_PS_TRANSPORT=grpc``).
      start: Start serving immediately.
      timeout_seconds: Deadline of a worker's calls to the parameter servers.
      snapshot_dir: A ``ps`` task writes ``ps<index>.npz`` there every ``snapshot_every``
        pushes and reloads it when restarted (default: ``STRATAX_PS_SNAPSHOT_DIR``; unset = no
        snapshots).
      snapshot_every: Pushes between snapshots (default: ``STRATAX_PS_SNAPSHOT_EVERY``, 100).
      chief_timeout_seconds: With no chief heard for this long (from the start, or since the
        chief's last heartbeat), ``join()`` returns False and the task stops serving (default:
        ``STRATAX_PS_CHIEF_TIMEOUT_SECONDS``, 120; at least 3).

    Example:
      >>> server = sx.Server({"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]},
      ...                    job_name="ps", task_index=0)      # doctest: +SKIP
      >>> server.join()                                        # doctest: +SKIP
    """

    def __init__(self, server_or_cluster_def: Any, job_name: str | None = None,
                 task_index: int | None = None, protocol: str | None = None,
                 config: Any = None, start: bool = True, timeout_seconds: float = 60.0,
                 snapshot_dir: str | None = None, snapshot_every: int | None = None,
                 chief_timeout_seconds: float | None = None) -> None:
        del config  # TensorFlow's session config has no meaning here
        if isinstance(server_or_cluster_def, ClusterResolver):
            job_name = job_name or server_or_cluster_def.task_type
            task_index = server_or_cluster_def.task_id if task_index is None else task_index
            server_or_cluster_def = server_or_cluster_def.cluster_spec()
        spec = ClusterSpec(server_or_cluster_def)
        if protocol not in (None, "grpc"):
            raise ValueError(f"protocol={protocol!r} is not supported; use 'grpc'.")
        if job_name not in SERVED_JOBS:
            raise ValueError(f"A Server runs a 'ps' or 'worker' task, got job_name={job_name!r}.")
        if task_index is None:
            raise ValueError("task_index is required (which task of the job this server is).")
        cluster_check.require_jobs(spec)
        self.cluster_spec = spec
        self.job_name = job_name
        self.task_index = int(task_index)
        self.address = spec.task_address(job_name, self.task_index)
        self._timeout = timeout_seconds
        self._chief_timeout = ownership.resolve_chief_timeout(chief_timeout_seconds)
        self._watch: ownership.ChiefWatch | None = None
        self._snapshot = (snapshot_dir, snapshot_every)
        self._thread: threading.Thread | None = None
        self._service: Any = None
        self._rpc: rpc_server.RpcServer | None = None
        if start:
            self.start()

    @property
    def target(self) -> str:
        """``grpc://host:port`` of this task."""
        return f"grpc://{self.address}"

    def start(self) -> None:
        """Starts listening (idempotent)."""
        if self._rpc is not None:
            return
        host, port = parse_address(self.address, f"{self.job_name}[{self.task_index}]")
        name = f"{self.job_name} {self.task_index}"
        rpc.keep_buffers_in_heap()
        if self.job_name == "ps":
            from stratax._src.parameter_server.tasks.ps import ParameterServer
            from stratax._src.parameter_server.tasks.snapshots import Snapshots

            self._service = ParameterServer(Snapshots.configured(self.task_index,
                                                                *self._snapshot))
        else:
            from stratax._src.parameter_server.tasks.worker import WorkerService

            self._service = WorkerService(self.task_index, self.cluster_spec.job_tasks("worker"),
                                          self.cluster_spec.job_tasks("ps"), self._timeout)
        self._watch = ownership.ChiefWatch(name, self._chief_timeout, self._service.reset,
                                               getattr(self._service, "adopt", lambda m: None))
        self._rpc = rpc_server.RpcServer(name, host, port, self._handle)
        self._rpc.start()
        self._watch.start()
        logger.info("%s serving at %s", name, self.address)

    def _handle(self, frame: wire.Frame) -> bytes:
        """Every call's one way in: the chief's questions before its claim (``hello``,
        ``session``, a ``ping`` with no session, which says only that the task is up) are
        answered here; every other call, whatever its method (a new one too), passes the
        session check before the service sees it."""
        method = frame.meta.get("method")
        if method == "hello":  # the chief checks that we agree on the cluster
            return cluster_check.answer_hello(frame, self.cluster_spec, self.job_name,
                                              self.task_index)
        if method == "session":  # a chief's claim or heartbeat
            return self._watch.claim(frame)
        if method == "ping" and "session" not in frame.meta:
            return rpc.response()
        self._watch.check(frame.meta)
        return self._service.handle(frame)

    def join(self, timeout: float | None = None) -> bool:
        """Blocks until the coordinator asks this task to stop, or no chief has been heard
        for ``chief_timeout_seconds`` (then ``chief_lost`` is True: exit with an error status),
        or ``timeout`` seconds pass; returns True if it stopped serving."""
        if self._rpc is None or self._watch is None:
            raise RuntimeError("Server.join() before start(); call start() first.")
        end = None if timeout is None else time.monotonic() + timeout
        while not (self._service.shutdown_requested.wait(0.2) or self._watch.lost.is_set()):
            if end is not None and time.monotonic() > end:
                return False
        self.stop()
        return True

    @property
    def chief_lost(self) -> bool:
        """True when the server stopped because no chief was heard for its chief timeout."""
        return self._watch is not None and self._watch.lost.is_set()

    def stop(self) -> None:
        """Stops serving and releases the port."""
        if self._watch is not None:
            self._watch.stop()
        if self._rpc is not None:
            self._rpc.stop(1.0)
            if hasattr(self._service, "close"):
                self._service.close()


def prepare_process() -> None:
    """Readies a process that exists to serve one task (``stratax server``, a served task of
    ``ParameterServerStrategy``), before its server starts: with a token (TLS), its stderr goes
    through ``handshake_log``'s filter, so peers without the cluster's key leave at most one
    line per 10 s, with a count, instead of gRPC's line each."""
    if rpc.read_token():
        handshake_log.install()


def serve(build: Callable[[], Server]) -> int:
    """Builds the server with ``build()`` and serves until the chief is done (returns 0) or no
    chief was heard for the chief timeout (returns 1), as ``stratax server`` and a served task
    of ``ParameterServerStrategy`` do.

    SIGTERM (a launcher's or Kubernetes' stop) first stops the server, which releases its port
    and removes its local socket's directory, then ends the process by the same signal, as
    its default action would (which would leave the directory behind). A SIGTERM that arrives
    while the server starts is noted and handled the same way once it has started. Called
    from another thread than the main one (where Python runs signal handlers), it only joins.
    """
    if threading.current_thread() is not threading.main_thread():
        server = build()
        server.join()
        return 1 if server.chief_lost else 0

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    # While it starts, a SIGTERM is only noted (a mask would hold it back from the main thread
    # only: delivered to another thread, the default action would end the process at once).
    pending: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: pending.append(signum))
    try:
        server = build()
    finally:
        signal.signal(signal.SIGTERM, terminate)
    try:
        if pending:
            raise SystemExit(128 + pending[0])
        server.join()
    except SystemExit:
        server.stop()
        logger.info("%s %d: stopped by SIGTERM", server.job_name, server.task_index)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    signal.signal(signal.SIGTERM, previous)
    return 1 if server.chief_lost else 0


def serve_and_exit(spec: Any, task_type: str, task_id: int | None,
                   timeout_seconds: float) -> None:
    """Serves this ``worker`` or ``ps`` task until the chief is done, then exits the process
    (status 1 when no chief was heard for the chief timeout): what constructing a
    ``ParameterServerStrategy`` does on a task that is not the chief, so the same program may
    be started on every task."""
    if task_type == "worker" and task_id is not None:  # a process that only serves
        compute_threads.limit_worker_threads(ClusterSpec(spec), task_id)
    prepare_process()
    if serve(lambda: Server(spec, job_name=task_type, task_index=task_id,
                            timeout_seconds=timeout_seconds)):
        sys.exit(1)  # no chief heard for the chief timeout
    logger.info("%s %s: the coordinator is done; exiting", task_type, task_id)
    sys.exit(0)
