"""The rendezvous store of an elastic launch across hosts, and its client: ``Rounds`` served
over gRPC, as torchrun's c10d rendezvous backend serves its state from a store in one agent.

The launcher on the host of ``--rdzv-endpoint`` hosts the store (it can bind that address);
every launcher, that one included, is an agent of it. The store is a single point, like
torchrun's c10d backend: when its host goes, the other agents stop with an error naming the
endpoint (``RendezvousClient.call``), not a hang. A cluster manager's restarts (Kubernetes,
Slurm) cover that case.

Security (the store listens on a non-loopback address): mutual TLS keyed by the cluster token
(``STRATAX_PS_TOKEN``/``STRATAX_PS_TOKEN_FILE``, the same on every node), the parameter
servers' ``cluster_tls``: a peer without the token completes no handshake, so it learns nothing
and reaches no handler. Messages are JSON objects only (never pickle), at most
``MAX_MESSAGE`` bytes (gRPC refuses a larger one before the handler runs), every field checked;
a bad message is answered ``{"error": ...}``. Each call has a deadline, and a connection that
does not finish its TLS handshake within ``_HANDSHAKE_MS`` is closed.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent import futures
from typing import Any

import grpc

from stratax._src.launch.config import Address, LaunchError
from stratax._src.launch.rounds import Rounds
from stratax._src.parameter_server.transport import cluster_tls

MAX_MESSAGE = 16 << 10
_METHOD = "/stratax.Rendezvous/Call"
_HANDSHAKE_MS = 5_000
_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.so_reuseport", 0)]
_TEXT = 500  # longest text field kept (a failure message is cut there)


class BadMessage(ValueError):
    """A message that is not a JSON object with the fields its ``op`` needs."""


def handle(rounds: Rounds, lock: threading.Lock, message: dict[str, Any], host: str, *,
           local: bool = False) -> dict[str, Any]:
    """Runs one agent ``message`` on ``rounds``; ``host`` is where the agent called from.

    Raises:
      BadMessage: an unknown ``op`` or a missing or ill-typed field (named).
    """
    op = _field(message, "op", str)
    node = _field(message, "node", str)
    if not 0 < len(node) <= 64:
        raise BadMessage(f"'node' must be 1 to 64 characters, got {len(node)}.")
    with lock:
        if op == "join":
            port = _field(message, "port", int)
            if not 1 <= port <= 65535:
                raise BadMessage(f"'port' must be in 1..65535, got {port}.")
            name = f"{host} ({_field(message, 'name', str)[:_TEXT]})"
            return rounds.join(node, host, port, name, local=local)
        if op == "sync":
            return rounds.sync(node)
        if op == "fail":
            return rounds.fail(node, _field(message, "round", int),
                               _field(message, "message", str)[:_TEXT])
        if op == "done":
            return rounds.finish(node, _field(message, "round", int))
        if op == "leave":
            return rounds.leave(node)
    raise BadMessage(f"unknown op {op[:40]!r}; expected join, sync, fail, done or leave.")


def _field(message: dict[str, Any], key: str, kind: type) -> Any:
    value = message.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BadMessage(f"field {key!r} must be a {kind.__name__}, got {type(value).__name__}.")
    return value


class RendezvousStore:
    """``Rounds`` served on ``address`` with mutual TLS keyed by ``token``.

    ``call`` is the in-process agent's way in (its node ranks first, see ``Rounds``).

    Raises:
      LaunchError: ``address`` cannot be bound (in use, or not an address of this host).
    """

    def __init__(self, rounds: Rounds, address: Address, token: str) -> None:
        self.rounds = rounds
        self.address = address
        self._lock = threading.Lock()
        self._executor = futures.ThreadPoolExecutor(max_workers=4,
                                                    thread_name_prefix="stratax-rdzv")
        self._server = grpc.server(
            self._executor, maximum_concurrent_rpcs=16,
            options=[*_OPTIONS, ("grpc.server_handshake_timeout_ms", _HANDSHAKE_MS)])
        method = grpc.unary_unary_rpc_method_handler(self._serve)
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("stratax.Rendezvous", {"Call": method}),))
        try:
            port = self._server.add_secure_port(str(address),
                                                cluster_tls.server_credentials(token))
        except RuntimeError:  # gRPC's "Failed to bind to address ..."
            port = 0
        if port == 0:
            self._executor.shutdown(wait=False)
            raise LaunchError(f"The rendezvous store cannot listen on {address} (the port "
                              "was taken meanwhile); pick another port for --rdzv-endpoint on "
                              "every node.")
        self._server.start()

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        return handle(self.rounds, self._lock, message, self.address.host, local=True)

    def _serve(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            message = json.loads(request.decode("utf-8"))
            if not isinstance(message, dict):
                raise BadMessage(f"a message is a JSON object, got {type(message).__name__}.")
            reply = handle(self.rounds, self._lock, message, _peer_host(context.peer()))
        except (UnicodeDecodeError, json.JSONDecodeError, BadMessage) as err:
            reply = {"error": f"bad rendezvous message: {err}"}
        return json.dumps(reply).encode("utf-8")

    def close(self, grace: float = 0.5) -> None:
        self._server.stop(grace).wait()
        self._executor.shutdown(wait=True)


def _peer_host(peer: str) -> str:
    """The host of a gRPC peer string: ``ipv4:10.0.0.2:5000`` -> ``10.0.0.2``."""
    kind, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0] if kind in ("ipv4", "ipv6") else rest
    return host.strip("[]") or "unknown"


class RendezvousClient:
    """An agent's connection to the store at ``address`` (mutual TLS keyed by ``token``)."""

    def __init__(self, address: Address, token: str, *, call_timeout: float = 5.0) -> None:
        # A channel, not a connection: it connects (TLS, keyed by ``token``) at the first call.
        self.address = address
        self._timeout = call_timeout
        self._channel = grpc.secure_channel(
            str(address), cluster_tls.channel_credentials(token),
            options=[*_OPTIONS, ("grpc.ssl_target_name_override", cluster_tls.TARGET_NAME),
                     ("grpc.initial_reconnect_backoff_ms", 200),
                     ("grpc.max_reconnect_backoff_ms", 500)])
        self._call = self._channel.unary_unary(_METHOD)

    def call(self, message: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """The store's reply to ``message`` within ``timeout`` seconds (default: the client's).

        Raises:
          ConnectionError: the store did not answer within the call's deadline.
          LaunchError: the store refused the message (its error quoted).
        """
        try:
            raw = self._call(json.dumps(message).encode("utf-8"),
                             timeout=self._timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise ConnectionError(f"{err.code().name}: {err.details()}") from err
        reply = json.loads(raw.decode("utf-8"))
        if not isinstance(reply, dict) or "error" in reply:
            raise LaunchError(f"the rendezvous store at {self.address} refused a message: "
                              f"{reply.get('error') if isinstance(reply, dict) else reply}")
        return reply

    def close(self) -> None:
        self._channel.close()


def can_bind(address: Address) -> bool:
    """True when ``address`` is an address of this host with its port free: this launcher
    hosts the store (torchrun's c10d backend decides the same way)."""
    family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address.host, address.port))
        except OSError:
            return False
    return True


def call_until(client: RendezvousClient, message: dict[str, Any], wait: float,
               stop: threading.Event) -> dict[str, Any] | None:
    """``client.call(message)``, retried for ``wait`` seconds while the store does not answer;
    ``None`` when ``stop`` is set meanwhile.

    Raises:
      LaunchError: no answer within ``wait``, naming the endpoint and the fixes.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            return client.call(message, max(0.2, min(5.0, deadline - time.monotonic())))
        except ConnectionError as err:
            if stop.is_set():
                return None
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"Cannot reach the rendezvous store at {client.address} ({err}) for "
                    f"{wait:g} s. Start the launcher on that host (the store's), check that "
                    "--rdzv-endpoint names its address and that every node has the same "
                    "STRATAX_PS_TOKEN (a node with another token is refused); the store's host "
                    "is a single point: if it went, the job ended with it.") from None
            stop.wait(0.25)
