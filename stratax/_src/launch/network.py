"""Ports and reachability checks the launcher does before it starts workers.

The coordinator is opened later by the rank-0 child's ``jax.distributed``; these checks turn the
usual start-up failures (port taken, node 0 not up) into one clear error instead of a hang.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from stratax._src.launch.config import Address, LaunchError

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def reserve_free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """Returns ``count`` distinct ports that were free on ``host`` a moment ago.

    All sockets are held open until every port is chosen (so the ports are distinct) and closed
    just before returning, which keeps the window in which another program could take one small.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def ensure_port_free(address: Address) -> None:
    """Raises :class:`LaunchError` when ``address.port`` cannot be bound on this machine.

    The coordinator binds only the address the cluster names (``runtime.distributed``); the
    check binds the port on every interface, which also catches a process holding it on another
    address of this machine.
    ``SO_REUSEADDR`` avoids false alarms from connections of a previous run in TIME_WAIT.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", address.port))
    except OSError as err:
        raise LaunchError(
            f"Coordinator address {address} is not usable on this node (node 0): port "
            f"{address.port} is already in use ({err.strerror}). Pass another port, e.g. "
            f"--coordinator {_with_port(address, address.port + 1)}, or omit --coordinator on "
            f"a single node to let the launcher pick a free one."
        ) from err
    finally:
        sock.close()


def wait_until_reachable(
    address: Address,
    wait_seconds: float,
    *,
    stop: threading.Event | None = None,
    retry_interval: float = 0.25,
) -> None:
    """Retries a TCP connection to ``address`` for up to ``wait_seconds``.

    Nodes with ``node_rank > 0`` use it before starting workers: node 0's coordinator is opened
    by its rank-0 child, which may start after this node. A set ``stop`` event ends the wait
    early (the launcher was interrupted) without raising.

    Raises:
        LaunchError: naming the address and the wait when no connection succeeded in time.
    """
    deadline = time.monotonic() + wait_seconds
    attempts = 0
    last_error: OSError | None = None
    while True:
        attempts += 1
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection(
                (address.host, address.port), timeout=max(0.1, min(2.0, remaining))
            ):
                logger.debug("Coordinator %s reachable after %d attempt(s).", address, attempts)
                return
        except OSError as err:
            last_error = err
        if stop is not None and stop.is_set():
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if stop is not None:
            stop.wait(min(retry_interval, remaining))
        else:
            time.sleep(min(retry_interval, remaining))
    reason = (last_error.strerror or str(last_error)) if last_error else "no answer"
    raise LaunchError(
        f"Cannot reach the coordinator at {address} from this node after {wait_seconds:g} s "
        f"({attempts} attempts, last error: {reason}). Start node 0 (--node-rank 0) first, "
        f"check that --coordinator names node 0's address and that the port is open, or wait "
        f"longer with --coordinator-wait SECONDS."
    )


def _with_port(address: Address, port: int) -> Address:
    return Address(address.host, port if port <= 65535 else 29500)
