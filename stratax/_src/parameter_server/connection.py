"""The chief's connection to the tasks of a parameter-server cluster: one client per task,
the start-up checks, the chief session it shares with this process's other strategies
(``shared_session``), and the goodbye at shutdown."""

from __future__ import annotations

import logging
from typing import Any

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.parameter_server import shared_session
from stratax._src.parameter_server.tasks import cluster_check
from stratax._src.parameter_server.transport.ps_client import PSClients
from stratax._src.parameter_server.transport.rpc import RpcClient

logger = logging.getLogger(__name__)


class TaskConnection:
    """Clients of every ``ps`` and ``worker`` task, ready and claimed for this chief.

    Args:
      spec: The cluster (``ClusterSpec`` or its dictionary).
      timeout_seconds: Bound on each call and on waiting for a task at start-up.
      on_restart: Called with a task's client when the heartbeat sees it answer as a new
        process.

    Raises:
      WorkerUnavailableError: a task does not answer within ``timeout_seconds``.
      ValueError: a task serves another cluster than ``spec`` (``cluster_check.agree``).
    """

    def __init__(self, spec: Any, timeout_seconds: float, on_restart: Any) -> None:
        self.ps_addresses = list(spec.job_tasks("ps"))
        self.ps = PSClients(self.ps_addresses, timeout_seconds)
        self.workers = [RpcClient(f"worker {i}", a, timeout_seconds)
                        for i, a in enumerate(spec.job_tasks("worker"))]
        try:
            for client in self.clients:
                client.wait_ready(timeout_seconds)
            cluster_check.agree(self.clients, ClusterSpec(spec), timeout_seconds)
            # This process's session on the cluster: the first strategy claims every task (reset
            # after a previous chief) and heartbeats; a later one shares it in its namespace.
            self.membership = shared_session.sessions.join(
                self.ps_addresses, spec.job_tasks("worker"), timeout_seconds, self.clients,
                on_restart)
        except BaseException:
            self._close_clients()
            raise

    @property
    def clients(self) -> list[RpcClient]:
        """Every task's client: the parameter servers, then the workers."""
        return [*self.ps.clients, *self.workers]

    def close(self) -> None:
        """Leaves the session; the last strategy of this process on the cluster asks every
        task to exit. An earlier one only lets go: its variables stay until the tasks exit."""
        last = shared_session.sessions.leave(self.membership)
        for client in [*self.workers, *self.ps.clients]:
            try:
                if last:
                    client.call("shutdown", timeout=5)
            except Exception as err:
                logger.info("%s did not take the shutdown request: %s", client.name, err)
        self._close_clients()

    def _close_clients(self) -> None:
        for client in self.workers:
            client.close()
        self.ps.close()
