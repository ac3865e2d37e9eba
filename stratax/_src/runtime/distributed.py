"""Joining the processes of a synchronous multi-worker job with ``jax.distributed``.

JAX's coordination service (hosted by process 0, the chief or worker 0) does the rendezvous
and health checks; gloo carries CPU collectives, NCCL GPU ones. This module adds what TensorFlow
users expect around it:

- the coordinator binds to the address the cluster gives it (loopback stays loopback), never to
  every interface as ``jax.distributed`` does by default; JAX's coordination service has no
  authentication, so a non-loopback coordinator must sit on a trusted network (logged);
- a worker first checks that the coordinator answers, and fails with an error naming it
  instead of aborting inside XLA;
- every wait is bounded by ``timeout_seconds`` (start-up, collectives, shutdown); JAX's
  heartbeat check, which aborts every process when one stops answering, waits twice that, so
  that a stratax collective's own timeout (``cpu_collectives``) comes first and names the
  silent peer in a ``WorkerUnavailableError``;
- an uncaught exception ends the worker at once instead of in JAX's shutdown barrier, and
  SIGTERM ends it unless a preemption-aware callback is training (``worker_exit``);
- a failed collective is reported as ``WorkerUnavailableError`` naming the processes that
  stopped answering;
- each process publishes its host in the coordination service, so that a launcher that names
  only the coordinator (torchrun across nodes, mpirun) still gets a cluster spec listing every
  worker once the group has formed (``gathered_hosts``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import jax

from stratax._src import seam
from stratax._src.cluster.process_layout import ProcessLayout
from stratax._src.core.addresses import is_loopback
from stratax._src.core.errors import CollectiveTimeoutError, WorkerUnavailableError
from stratax._src.runtime import cpu_collectives, gloo_io, worker_exit
from stratax._src.runtime.devices import jax_started

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _Runtime:
    """What this process joined (one per process; tests may build their own)."""

    def __init__(self) -> None:
        self.layout: ProcessLayout | None = None
        self.task_names: dict[int, str] = {}


runtime = _Runtime()


def task_name(process_id: int) -> str:
    """``"worker 1"``-style name of a process of the job, for messages."""
    return runtime.task_names.get(process_id, f"process {process_id}")


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def wait_for_coordinator(address: str, timeout_seconds: float, name: str) -> None:
    """Retries a TCP connection to ``address`` until it answers or ``timeout_seconds`` pass.

    Raises:
        CollectiveTimeoutError: nothing answered at ``address`` in time.
    """
    host, port = _split(address)
    deadline = time.monotonic() + timeout_seconds
    last_error: OSError | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as error:
            last_error = error
            time.sleep(0.2)
    raise CollectiveTimeoutError(
        f"The coordinator, {name}, did not answer at {address} within {timeout_seconds:g} s "
        f"(last error: {last_error}). Check that {name} is running and that every worker got "
        "the same cluster (TF_CONFIG); raise CommunicationOptions(timeout_seconds=...) if it "
        "starts slowly."
    )


def _configure_cpu_collectives(name: str, coordinator_host: str) -> None:
    """Selects JAX's CPU collectives; MPI's must run on the thread that started MPI, so with
    ``mpi`` every computation runs on the calling thread (no asynchronous CPU dispatch)."""
    jax.config.update("jax_cpu_collectives_implementation", "mpi" if name == "mpi" else "gloo")
    if name == "mpi":
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    elif not is_loopback(coordinator_host):
        address = local_address_towards(coordinator_host)
        # JAX builds gloo's transport from the host name, which often resolves to loopback
        # (/etc/hosts): peers on other hosts could not connect ("Connection refused,
        # remote=[127.0.0.1]"). Must run before the CPU backend starts.
        seam.use_gloo_on_address(address)
        logger.info("gloo collectives on %s", address)


def local_address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent).

    Raises:
        OSError: ``host`` does not resolve or no route leads to it.
    """
    family, _, _, _, target = socket.getaddrinfo(host, 9, proto=socket.IPPROTO_UDP)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(target)
        return probe.getsockname()[0]


def initialize(layout: ProcessLayout, *, timeout_seconds: float, task_names: dict[int, str],
               implementation: str | None = None) -> None:
    """Starts ``jax.distributed`` for ``layout`` (no-op for one process or if already started).

    ``implementation``, the CPU collectives ``CommunicationOptions`` asks for, wins over option
    ``cpu_collectives``; see ``runtime.cpu_collectives.resolve``.

    Raises:
        RuntimeError: JAX already started its backends in this process without a cluster.
        CollectiveTimeoutError: the coordinator did not answer in time.
    """
    runtime.task_names = dict(task_names)
    if layout.num_processes == 1 or layout.coordinator_address is None:
        runtime.layout = layout
        return
    if jax.distributed.is_initialized():
        if jax.process_count() != layout.num_processes:
            raise RuntimeError(
                f"jax.distributed already joined {jax.process_count()} processes, but the cluster "
                f"has {layout.num_processes}; create one MultiWorkerMirroredStrategy per program."
            )
        _publish_host(layout)
        runtime.layout = layout
        return
    if jax_started():
        raise RuntimeError(
            "JAX already started in this process, so it can no longer join a multi-worker "
            "cluster. Create `sx.MultiWorkerMirroredStrategy()` at the top of the program, "
            "before any JAX computation or device query."
        )
    address = layout.coordinator_address
    host, port = _split(address)
    bind = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    if not is_loopback(host):
        logger.warning(
            "The jax.distributed coordinator listens on %s. JAX's coordination service has no "
            "authentication: run multi-worker jobs on a trusted private network only.", bind)
    collectives = cpu_collectives.resolve(implementation)
    gloo_priority = gloo_io.io_priority()
    _configure_cpu_collectives(collectives, host)
    timeout = max(int(timeout_seconds), 1)
    if not layout.is_coordinator:
        wait_for_coordinator(address, timeout_seconds, task_name(0))
    logger.info("%s joining %d processes via %s", task_name(layout.process_id),
                layout.num_processes, address)
    watchdog = threading.Timer(max(timeout - 0.5, 0.1), _report_join_timeout,
                               args=(layout, timeout))
    watchdog.daemon = True
    watchdog.start()
    try:
        with worker_exit.joining(task_name(layout.process_id)):
            jax.distributed.initialize(
                coordinator_address=address,
                num_processes=layout.num_processes,
                process_id=layout.process_id,
                coordinator_bind_address=bind,
                initialization_timeout=timeout,
                heartbeat_timeout_seconds=2 * timeout,
                shutdown_timeout_seconds=timeout,
            )
    finally:
        watchdog.cancel()
    cpu_collectives.start(collectives, layout.process_id, layout.num_processes,
                          timeout_seconds, task_name, gloo_priority,
                          cpu_collectives.setting(implementation))
    _publish_host(layout)
    runtime.layout = layout


_HOSTS_KEY = "stratax/host/"


def advertised_host(layout: ProcessLayout) -> str:
    """This process' host as its peers reach it.

    Process 0 is at the coordinator's host. When the coordinator is on loopback every process
    runs on that machine, so all are at that host too. Otherwise a process is at this
    machine's address on the route to the coordinator: the address gloo binds to
    (``_configure_cpu_collectives``), which the environment of torchrun or mpirun never names.
    """
    host, _ = _split(layout.coordinator_address or "")
    if layout.process_id == 0 or is_loopback(host):
        return host
    return local_address_towards(host)


def _publish_host(layout: ProcessLayout) -> None:
    """Writes ``advertised_host`` under this process' key (every process, always, so that a
    peer that reads it never waits on a process that did not write)."""
    seam.distributed_client().key_value_set(f"{_HOSTS_KEY}{layout.process_id}",
                                            advertised_host(layout), allow_overwrite=True)


def gathered_hosts(timeout_seconds: float) -> list[str]:
    """Every process' ``advertised_host``, by process id, read from the coordination service.

    Raises:
        CollectiveTimeoutError: a process did not publish its host within ``timeout_seconds``.
    """
    return gathered(_HOSTS_KEY, timeout_seconds, "its host")


def published_and_gathered(prefix: str, value: str, timeout_seconds: float,
                           what: str) -> list[str]:
    """``value`` written under ``prefix<this process' id>``, then every process' value by
    process id: an agreement through the coordination service, not a compiled collective, so
    it costs no step. Every process must call it with the same ``prefix``."""
    _client("published_and_gathered").key_value_set(f"{prefix}{jax.process_index()}", value)
    return gathered(prefix, timeout_seconds, what)


def _client(caller: str) -> Any:
    """The coordination service's client; ``RuntimeError`` outside a joined group."""
    client = seam.distributed_client()
    if client is None:
        raise RuntimeError(f"{caller} needs a joined group of several processes.")
    return client


def gathered(prefix: str, timeout_seconds: float, what: str) -> list[str]:
    """What every process wrote under ``prefix<process id>``, by process id.

    Raises:
        CollectiveTimeoutError: a process did not publish ``what`` within ``timeout_seconds``.
    """
    client = _client("gathered")
    # One call reads what is there (often every value: each wrote it before it was needed).
    values = {int(key.rsplit("/", 1)[1]): value
              for key, value in client.key_value_dir_get(prefix)}
    for process in range(jax.process_count()):
        if process not in values:
            try:
                values[process] = client.blocking_key_value_get(
                    f"{prefix}{process}", max(int(timeout_seconds * 1000), 1))
            except Exception as error:  # XLA's runtime error for a deadline
                raise CollectiveTimeoutError(
                    f"{task_name(process)} did not publish {what} within {timeout_seconds:g} s "
                    f"({error}); check that it is still running.") from error
    return [values[process] for process in range(jax.process_count())]


def _report_join_timeout(layout: ProcessLayout, timeout: int) -> None:
    """Says, in words, why XLA is about to abort the start-up rendezvous (it names no task)."""
    others = [task_name(p) for p in range(layout.num_processes) if p != layout.process_id]
    # An error record: Python's last-resort handler prints it even where logging is not set up.
    logger.error(
        "stratax: %s waited %d s for the cluster to assemble, but not every task joined; "
        "expected: %s. Start every task with the same cluster (TF_CONFIG), or raise "
        "CommunicationOptions(timeout_seconds=...). JAX now ends this process.",
        task_name(layout.process_id), timeout, ", ".join(others))


def dead_processes() -> list[int]:
    """Processes the coordination service no longer sees (empty when unknown or all alive)."""
    client = seam.distributed_client()
    layout = runtime.layout
    if client is None or layout is None:
        return []
    everyone = list(range(layout.num_processes))
    try:
        alive = client.get_live_nodes(everyone)
    except Exception:
        return [0] if layout.process_id != 0 else []
    return [p for p in everyone if p not in alive]


def translate_collective_errors(call: Callable[[], T]) -> T:
    """Runs ``call``; a collective that failed because a peer died becomes
    ``WorkerUnavailableError``."""
    try:
        return call()
    except Exception as error:  # Keras re-raises XLA's runtime errors under other types
        translated = _peer_error(error)
        if translated is error:
            raise
        raise translated from error


_PEER_FAILURE_MARKS = ("Gloo", "Connection closed by peer", "NCCL", "heartbeat timeout",
                       "unhealthy")


def _peer_error(error: Exception) -> Exception:
    text = str(error)
    failure = cpu_collectives.describe_peer_failure(text, task_name)
    if failure is not None:
        return WorkerUnavailableError(
            f"{failure}. Restart the job (e.g. `stratax launch --max-restarts K`) and resume "
            "from the last backup.")
    if not any(mark in text for mark in _PEER_FAILURE_MARKS):
        return error
    dead = dead_processes()
    names = ", ".join(task_name(p) for p in dead) or "a peer (not identified: " + text[:200] + ")"
    return WorkerUnavailableError(
        f"A collective failed because {names} stopped answering. Restart the job (e.g. "
        "`stratax launch --max-restarts K`) and resume from the last backup."
    )


def shutdown() -> None:
    """Leaves the cluster (bounded by the shutdown timeout given at start-up)."""
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()
