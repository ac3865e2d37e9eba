"""gRPC transport for parameter servers and workers: raw frames, deadlines, chunking, tokens.

Every service exposes two raw-bytes methods: ``Call`` (unary, for frames up to ``CHUNK_BYTES``)
and ``Stream`` (the same frame cut into ``CHUNK_BYTES`` chunks both ways, for large tensors,
which stream faster than one unary message: docs/design/performance.md). No protobuf, no pickle:
the bytes are ``wire`` frames, whose ``meta["method"]`` names the operation.

Security (loopback is no trust boundary: any local user can reach a loopback port). A call is
trusted in one of three ways, and nothing else reaches a handler:

- over gRPC, with mutual TLS keyed by the cluster's shared token (``STRATAX_PS_TOKEN`` or the
  file named by ``STRATAX_PS_TOKEN_FILE``; ``stratax launch`` makes one per run): each side
  proves it holds the token without sending it (``cluster_tls``), so a listener at a task's
  address (a squatter on a dead task's port) learns nothing and the client refuses it, and
  every frame between hosts is encrypted. A server without a token takes no ``Call``/``Stream``
  over gRPC at all, and a client without one sends none (whoever listens at the port gets no
  request); binding anything but loopback requires a token;
- over the server's Unix socket (``local_socket``), from a process of the server's own uid
  (checked with ``SO_PEERCRED``; such a process could read the token anyway);
- over the server's sealed TCP port (``sealed``), on a connection that presents a ticket the
  server issued in a ``Ticket`` call over that TLS, every byte after it sealed with the
  ticket's keys.

The one gRPC method that needs no trust is ``Local``: where the socket is (over TLS when the
server has a token). A peer without the token fails the TLS handshake before any request; on a
server without a token, a ``Call``/``Stream`` is answered ``UNAUTHENTICATED`` by an
interceptor, before its body is read (a flood of large unauthenticated calls costs no memory),
and logged (at most once per 10 s, with a count).

Bounds: at most ``ps_max_connections`` concurrent calls (more are answered
``RESOURCE_EXHAUSTED``), a connection that has not finished its handshake in
``rpc_server._HANDSHAKE_MS`` is closed, a server without a token takes no message over 64 KiB
(it answers only ``Local``), and a streamed frame over ``ps_max_frame_mib`` is refused as it
arrives.

The server is ``rpc_server.RpcServer``; this module holds the client, ``RpcClient``, and what
both sides share (frames, tokens, options).

Same host: a client asks ``Local`` and, on the same host (and uid), sends its frames over the
socket (same frames, same handler, same errors and deadlines; frames up to 4 MiB in a buffer
shared under the socket, see ``shared_frames``), unless ``STRATAX_PS_TRANSPORT=grpc``.

Other hosts: with a token, ``Local`` also names the server's sealed TCP port, and the client
sends the same frames there, sealed with AES-GCM under keys from a ``Ticket`` call over TLS
(``sealed``: the cipher's own cost per byte, where gRPC's TLS costs several times that); gRPC
carries the calls only where that port cannot be reached (or with
``STRATAX_PS_TRANSPORT=grpc``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from stratax._src.cluster.cluster_spec import parse_address
from stratax._src.core import env
from stratax._src.core.errors import StrataxError, WorkerUnavailableError
from stratax._src.parameter_server.transport import cluster_tls, local_socket, sealed, wire
from stratax._src.parameter_server.transport.channel import FrameChannel, SocketGone

logger = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20
_MAX_MESSAGE = CHUNK_BYTES + (1 << 20)
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.so_reuseport", 0),
    # A 16 MiB HTTP/2 stream window: a megabyte message goes out without waiting for the
    # peer's window updates, which saves client CPU (docs/design/performance.md).
    ("grpc.http2.lookahead_bytes", 16 << 20),
]
# Reconnect quickly to a restarted task (gRPC's default backoff grows to 2 minutes).
_CLIENT_OPTIONS = [*GRPC_OPTIONS, ("grpc.initial_reconnect_backoff_ms", 200),
                   ("grpc.min_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]
Handler = Callable[[wire.Frame], bytes]


class RemoteError(StrataxError):
    """An operation failed on a server; the message names the server and quotes its error.

    ``remote_type`` is the name of the exception's class on the server (``"ValueError"``), or
    ``None``: a name only, so the caller can re-raise a builtin type without the server ever
    choosing what is imported or built here.
    """

    def __init__(self, message: str, remote_type: str | None = None) -> None:
        super().__init__(message)
        self.remote_type = remote_type


def read_token() -> str | None:
    """The shared token from ``STRATAX_PS_TOKEN``, else the file ``STRATAX_PS_TOKEN_FILE``."""
    token = os.environ.get(env.STRATAX_PS_TOKEN)
    if token:
        return token
    path = os.environ.get(env.STRATAX_PS_TOKEN_FILE)
    if path:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise ValueError(f"Token file {path!r} ({env.STRATAX_PS_TOKEN_FILE}) is empty.")
        return token
    return None


def keep_buffers_in_heap() -> bool:
    """Makes glibc serve allocations below 32 MiB from the heap and keep up to 128 MiB of
    freed memory, instead of mapping and unmapping every megabyte message buffer.

    Each fresh mapping is paid in page faults on every call, a large part of a megabyte
    call's cost (docs/design/performance.md). Called by the
    ``ps`` and ``worker`` task servers (processes stratax owns), not by the chief. Returns
    False where the C library has no ``mallopt`` (not glibc).
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(
        mallopt(m_trim_threshold, 128 << 20))


class Dispatcher:
    """A service whose ``handle(frame)`` calls the handler its ``method`` field names.

    Subclasses fill ``self._methods`` (method name -> ``handler(frame) -> response bytes``).
    """

    _methods: dict[str, Handler]

    def handle(self, frame: wire.Frame) -> bytes:
        method = wire.require(frame.meta, "method", str)
        if method not in self._methods:
            raise wire.WireError(
                f"Unknown method {method!r}; expected one of {sorted(self._methods)}.")
        return self._methods[method](frame)


def response(meta: dict[str, Any] | None = None, tensors: list[Any] | tuple = ()) -> bytes:
    """A success frame."""
    return wire.encode({"ok": True, **(meta or {})}, tensors)


def error_response(message: str, kind: str = "error", error_type: str | None = None) -> bytes:
    """An error frame carrying ``message`` and the exception's class name ``error_type``
    (strings, never a pickled exception)."""
    typed = {"type": error_type} if error_type else {}
    return wire.encode({"ok": False, "error": message, "kind": kind, **typed})


def frame_chunks(parts: list[bytes | memoryview]) -> Iterator[bytes]:
    """The buffers of a frame cut into chunks of at most ``CHUNK_BYTES`` (one copy per chunk,
    never of the whole frame)."""
    if not parts:
        yield b""
    for part in parts:
        view = memoryview(part).cast("B")
        for start in range(0, max(len(view), 1), CHUNK_BYTES):
            yield bytes(view[start:start + CHUNK_BYTES])


class RpcClient:
    """Calls one server; every call has a deadline and names the server when it fails.

    The first call asks the server over gRPC for its local socket and sealed port; if the
    server is on this host (and the socket passes ``local_socket``'s checks) every call goes
    to the socket, else (with a token) to the sealed port (``sealed``), else over gRPC. A call
    that fails as unavailable drops the connection, and the next call asks again (a restarted
    server has a new socket and port).

    Args:
      name: The peer's task name for errors, e.g. ``"ps 0"``.
      address: ``host:port``.
      timeout: Default deadline of a call in seconds.
      transport: ``"auto"``, ``"socket"`` (the local socket without shared memory),
        ``"tcp"`` (the sealed TCP port even on this host) or ``"grpc"`` (default:
        ``STRATAX_PS_TRANSPORT``, else ``"auto"``).

    Example:
      >>> client = RpcClient("ps 0", "127.0.0.1:2222", timeout=10)   # doctest: +SKIP
      >>> client.call("ping").meta["ok"]                              # doctest: +SKIP
    """

    def __init__(self, name: str, address: str, timeout: float = 60.0,
                 token: str | None = None, transport: str | None = None) -> None:
        self.name = name
        self.address = address
        self.timeout = timeout
        self.session: str | None = None  # the chief's session id, sent with every call
        self._token = token if token is not None else read_token()
        self._mode = local_socket.transport_mode(transport)
        if self._token:
            self._channel = grpc.secure_channel(
                address, cluster_tls.channel_credentials(self._token),
                options=[*_CLIENT_OPTIONS, ("grpc.ssl_target_name_override",
                                            cluster_tls.TARGET_NAME)])
        else:
            self._channel = grpc.insecure_channel(address, options=_CLIENT_OPTIONS)
        self._unary = self._channel.unary_unary("/stratax.Service/Call")
        self._stream = self._channel.stream_stream("/stratax.Service/Stream")
        self._endpoint = self._channel.unary_unary("/stratax.Service/Local")
        self._tickets = self._channel.unary_unary("/stratax.Service/Ticket")
        self._local_lock = threading.Lock()
        self._local: FrameChannel | None = None
        self._grpc_only = self._mode == "grpc"  # until a failure makes it ask again
        self._no_local = f"transport {self._mode!r}" if self._grpc_only else ""  # why gRPC

    @property
    def transport(self) -> str:
        """``"unix"`` while calls go over the server's local socket, ``"tcp"`` over its sealed
        TCP port (``sealed``), else ``"grpc"``."""
        local = self._local
        if local is None:
            return "grpc"
        return "tcp" if isinstance(local, sealed.SealedChannel) else "unix"

    def close(self) -> None:
        self._forget_local()
        self._channel.close()

    def call(self, method: str, meta: dict[str, Any] | None = None, tensors: Any = (),
             timeout: float | None = None, stream: bool = False) -> wire.Frame:
        """Runs ``method`` on the server and returns its decoded reply.

        Args:
          stream: Send and receive in chunks (use when the reply may exceed ``CHUNK_BYTES``);
            over the local socket every frame goes whole.

        Raises:
          WorkerUnavailableError: The server did not answer within the deadline or is down.
          RemoteError: The server answered with an error.
        """
        session = {"session": self.session} if self.session else {}
        parts = wire.encode_parts({"method": method, **session, **(meta or {})}, tensors)
        deadline = self.timeout if timeout is None else timeout
        try:
            for attempt in (1, 2):
                local = self._local_channel(method, deadline)
                if local is None:
                    if not self._token:
                        # No server takes this call over gRPC without a token, and whoever
                        # listens at the port (a squatter, say) must not get the request.
                        raise RemoteError(
                            f"{self.name} at {self.address}: no trusted way to call it: its "
                            f"local socket is not usable ({self._no_local or 'unknown'}) and no "
                            f"token is set here for gRPC; set the same "
                            f"{env.STRATAX_PS_TOKEN}=<secret> (or "
                            f"{env.STRATAX_PS_TOKEN_FILE}=<path>) on every task of the cluster.")
                    data = self._grpc(method, deadline, lambda: self._grpc_call(
                        parts, deadline, stream))
                    break
                try:
                    data = local.call(parts, method, deadline)
                    break
                except SocketGone as err:  # restarted? ask it where it listens
                    self._forget_local()
                    if attempt == 2:
                        raise WorkerUnavailableError(str(err)) from None
        except WorkerUnavailableError:
            self._forget_local()
            raise
        reply = wire.decode(data)
        if not reply.meta.get("ok"):
            remote_type = reply.meta.get("type")
            raise RemoteError(f"{self.name} at {self.address}: {method} failed: "
                              f"{reply.meta.get('error', 'unknown error')}",
                              remote_type if isinstance(remote_type, str) else None)
        return reply

    def _grpc_call(self, parts: list[bytes | memoryview], deadline: float,
                   stream: bool) -> bytes:
        if stream or sum(len(p) for p in parts) > CHUNK_BYTES:
            return b"".join(self._stream(frame_chunks(parts), timeout=deadline))
        request = parts[0] if len(parts) == 1 else b"".join(parts)
        return self._unary(request, timeout=deadline)

    def _grpc(self, method: str, deadline: float, invoke: Callable[[], bytes],
              discovery: bool = False) -> bytes:
        """``invoke()``, a gRPC call, with its errors turned into ours (except, when
        ``discovery``, a server too old to offer a local socket: ``grpc.RpcError``)."""
        try:
            return invoke()
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                why = f" (its local socket was not usable: {self._no_local})" if (
                    self._no_local and not self._token) else ""
                raise RemoteError(f"{self.name} at {self.address} refused the call: "
                                  f"{err.details()}{why}") from None
            if discovery and code == grpc.StatusCode.UNIMPLEMENTED:
                raise
            details = err.details() if hasattr(err, "details") else ""
            if "handshake" in (details or "").lower():
                what = (f"failed {method!r}: the TLS handshake failed, so it does not hold this "
                        f"cluster's key (another cluster's task, a task with another "
                        f"{env.STRATAX_PS_TOKEN}, or an impostor at its address; nothing was "
                        "sent to it)")
            elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
                what = f"did not answer {method!r} within {deadline:g} s"
            else:
                what = f"failed {method!r} ({code.name if code else err}: unreachable or died"
                what += (f"; or it takes only TLS: set the cluster's {env.STRATAX_PS_TOKEN} "
                         "here too)") if not self._token else ")"
            raise WorkerUnavailableError(
                f"{self.name} at {self.address} {what}; check that the task is running."
            ) from None

    def _local_channel(self, method: str, deadline: float) -> FrameChannel | None:
        """The server's local socket or sealed port, asked for over gRPC on first use; None:
        use gRPC."""
        if self._grpc_only:
            return None
        with self._local_lock:
            if self._local is not None or self._grpc_only:
                return self._local
            try:
                data = self._grpc(method, deadline, lambda: self._endpoint(
                    b"", timeout=deadline), discovery=True)
                self._local = self._framed(wire.decode(data).meta, deadline)
            except (grpc.RpcError, wire.WireError, ValueError, OSError) as err:
                logger.info("%s at %s: calls go over gRPC (no usable local socket or sealed "
                            "port: %s)", self.name, self.address, err)
                self._no_local = str(err)
                self._grpc_only = True
                return None
            logger.info("%s at %s: calls go over %s", self.name, self.address,
                        self._local.where)
            return self._local

    def _framed(self, endpoint: dict[str, Any], deadline: float) -> FrameChannel:
        """The local socket where the server is on this host (and the mode allows it), else
        its sealed port where a token is set; ``ValueError`` or ``OSError`` saying why not."""
        why = "transport 'tcp'"
        if self._mode != "tcp":
            if not local_socket.SUPPORTED:
                why = "this system has no Unix socket credentials"
            else:
                try:
                    return local_socket.LocalChannel(self.name, self.address, endpoint, deadline,
                                                     self._mode == "auto")
                except (ValueError, OSError) as err:
                    why = str(err)
        port = endpoint.get("sealed_port")
        if not self._token:
            raise ValueError(why)
        if type(port) is not int:
            raise ValueError(f"{why}; and it offers no sealed port")
        host, _ = parse_address(self.address, self.name)
        return sealed.SealedChannel(self.name, self.address, host, port, self._ticket, deadline)

    def _ticket(self, end: float) -> dict[str, Any]:
        """A ticket for one sealed connection, from the server over TLS (``sealed``)."""
        left = max(end - time.monotonic(), 0.001)
        return wire.decode(self._grpc("ticket", left, lambda: self._tickets(
            b"", timeout=left))).meta

    def _forget_local(self) -> None:
        with self._local_lock:
            if self._local is not None:
                self._local.close()
                self._local = None
            self._grpc_only = self._mode == "grpc"

    def wait_ready(self, timeout: float) -> None:
        """Waits until the server answers ``ping``; raises ``WorkerUnavailableError`` after
        ``timeout`` seconds, naming the server and its address."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise WorkerUnavailableError(
                f"{self.name} at {self.address} did not answer within {timeout:g} s; check that "
                "the task is running and that the address in the cluster spec is right."
            ) from None
        self.call("ping", timeout=timeout)
