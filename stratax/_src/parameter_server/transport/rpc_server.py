"""The server side of the parameter-server transport (``rpc``): ``RpcServer`` serves one handler
over gRPC (``Call``, ``Stream``, ``Local``, ``Ticket``), on the same host over
``local_listener``'s socket and, with a token, over ``sealed_listener``'s port, with the trust
rules and bounds ``rpc``'s docstring lists.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from stratax._src.core import env
from stratax._src.core.addresses import is_loopback
from stratax._src.core.config import config
from stratax._src.parameter_server.transport import (
    cluster_tls,
    local_listener,
    local_socket,
    sealed,
    sealed_listener,
    wire,
)
from stratax._src.parameter_server.transport.refusals import Refusals
from stratax._src.parameter_server.transport.rpc import (
    GRPC_OPTIONS,
    Handler,
    error_response,
    frame_chunks,
    read_token,
    response,
)

logger = logging.getLogger(__name__)

_HANDSHAKE_MS = 10_000
_UNTRUSTED_MESSAGE = 64 << 10  # a server without a token answers only ``Local`` over gRPC


class RpcServer:
    """A gRPC server for one ``handler``: ``handler(frame) -> response bytes``.

    Example:
      >>> server = RpcServer("ps 0", "127.0.0.1", 0, handler)   # doctest: +SKIP
      >>> server.port                                            # doctest: +SKIP
    """

    def __init__(self, name: str, host: str, port: int, handler: Handler,
                 token: str | None = None, max_workers: int = 8,
                 transport: str | None = None) -> None:
        framed = local_socket.transport_mode(transport) != "grpc"
        use_local = framed and local_socket.SUPPORTED
        if token is None:
            token = read_token()
        if not is_loopback(host) and not token:
            raise ValueError(
                f"{name} would listen on {host}:{port}, which is not a loopback address, without "
                f"a shared token; set {env.STRATAX_PS_TOKEN}=<secret> "
                f"(or {env.STRATAX_PS_TOKEN_FILE}=<path>) on every task of the cluster."
            )
        self.name = name
        self._token = token
        self._handler = handler
        self._limit = min(config.ps_max_frame_mib << 20, wire.MAX_FRAME_BYTES)
        self._executor = futures.ThreadPoolExecutor(max_workers=max_workers,
                                                    thread_name_prefix=f"stratax-{name}")
        options = [*GRPC_OPTIONS, ("grpc.server_handshake_timeout_ms", _HANDSHAKE_MS)]
        if not token:
            options.append(("grpc.max_receive_message_length", _UNTRUSTED_MESSAGE))
        self._server = grpc.server(self._executor, options=options,
                                   interceptors=(_Gate(self),),
                                   maximum_concurrent_rpcs=config.ps_max_connections)
        methods = {
            "Call": grpc.unary_unary_rpc_method_handler(self._call),
            "Stream": grpc.stream_stream_rpc_method_handler(self._stream),
            "Local": grpc.unary_unary_rpc_method_handler(self._local_endpoint),
            "Ticket": grpc.unary_unary_rpc_method_handler(self._ticket),
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("stratax.Service", methods),))
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            if token:
                self.port = self._server.add_secure_port(
                    bind, cluster_tls.server_credentials(token))
            else:
                self.port = self._server.add_insecure_port(bind)
        except RuntimeError:  # gRPC's "Failed to bind to address ..."
            self.port = 0
        if self.port == 0:
            raise OSError(
                f"{name} could not listen on {bind}, its address in the cluster spec: the port "
                "is in use (by another process, or a task of another run) or the host is not "
                "an address of this machine; free the port or fix the address in the cluster "
                "spec.")
        self.local: local_listener.LocalListener | None = None
        why_not = "STRATAX_PS_TRANSPORT=grpc" if not use_local else ""
        if use_local:
            try:
                self.local = local_listener.LocalListener(
                    name, self._dispatch, lambda message: error_response(message, "wire"))
            except OSError as err:
                why_not = str(err)
                logger.warning("%s serves gRPC only: no local socket (%s)", name, err)
        self.sealed: sealed_listener.SealedListener | None = None
        self._tickets = sealed.Tickets()
        if framed and token:
            try:
                self.sealed = sealed_listener.SealedListener(
                    name, host, self._tickets, self._dispatch,
                    lambda message: error_response(message, "wire"))
            except OSError as err:
                logger.warning("%s serves other hosts over gRPC only: no sealed port (%s)",
                               name, err)
        if self.local is None and not token:
            self._server.stop(None)
            self._executor.shutdown(wait=False)
            raise ValueError(
                f"{name} would take no calls: without a shared token only its local socket is "
                f"trusted, and it has none ({why_not}); set {env.STRATAX_PS_TOKEN}=<secret> (or "
                f"{env.STRATAX_PS_TOKEN_FILE}=<path>) on every task of the cluster.")
        self._refusals = Refusals()
        self.stopped = threading.Event()

    def start(self) -> None:
        self._server.start()
        for listener in (self.local, self.sealed):
            if listener is not None:
                listener.start()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops serving (in-flight calls get ``grace`` seconds) and ends the handler threads."""
        stopping = self._server.stop(grace)
        for listener in (self.local, self.sealed):
            if listener is not None:
                listener.stop(grace)
        stopping.wait()
        self._executor.shutdown(wait=True)
        self.stopped.set()

    def untrusted(self, method: str) -> str | None:
        """Why a gRPC call to ``method`` is not trusted (see the module docstring), or None
        when it is: with a token, every call that reaches a handler came over a TLS connection
        whose client proved it holds the token."""
        if self._token or method == "Local":
            return None
        return "no token is set on this task"

    def refuse_unread(self, method: str, reason: str, requests: Iterator[bytes],
                      context: grpc.ServicerContext) -> Iterator[bytes]:
        """The handler of an untrusted call: logs it (rate-limited) and answers
        ``UNAUTHENTICATED`` without reading ``requests``."""
        del requests  # never read: its body is not buffered
        count = self._refusals.note()
        if count:
            logger.warning("%s refused a gRPC call to %s from %s: %s (%d refused since the "
                           "last such message)", self.name, method, context.peer(), reason,
                           count)
        self._refuse(context)
        return iter(())

    def _refuse(self, context: grpc.ServicerContext) -> None:
        context.abort(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{self.name} takes gRPC calls only with the cluster's shared token, and none is set "
            f"on it; without one only its local socket is trusted (processes of uid "
            f"{os.getuid()} on its host). Set the same {env.STRATAX_PS_TOKEN}=<secret> (or "
            f"{env.STRATAX_PS_TOKEN_FILE}=<path>) on every task of the cluster to call it over "
            "gRPC.")

    def _dispatch(self, data: bytes) -> bytes:
        try:
            frame = wire.decode(data)
        except wire.WireError as err:
            return error_response(f"malformed frame: {err}", "wire")
        try:
            return self._handler(frame)
        except wire.WireError as err:
            return error_response(f"malformed request: {err}", "wire")
        except Exception as err:
            logger.exception("%s failed on %s", self.name, frame.meta.get("method"))
            return error_response(f"{type(err).__name__}: {err}",
                                  error_type=type(err).__name__)

    def _local_endpoint(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        endpoint = self.local.endpoint() if self.local is not None else {"path": None}
        if self.sealed is not None:  # only with a token: this reply then went over TLS
            endpoint["sealed_port"] = self.sealed.port
        return response(endpoint)

    def _ticket(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """A ticket for one sealed connection (``sealed``); reached only over TLS (``_Gate``)."""
        if self.sealed is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self.name} has no sealed port")
        return response(self._tickets.issue())

    def _call(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return self._dispatch(request)

    def _stream(self, chunks: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        # A growing writable buffer (glibc grows large ones in place with mremap): decoded
        # tensors are views of it, which a server may keep (a created variable) as they are.
        data = bytearray()
        for chunk in chunks:
            data += chunk
            if len(data) > self._limit:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{self.name}: a frame over this task's limit of {self._limit} "
                              f"bytes ({env.STRATAX_PS_MAX_FRAME_MIB})")
        yield from frame_chunks([self._dispatch(data)])


class _Gate(grpc.ServerInterceptor):
    """Trust decided when a call starts, before gRPC reads its body: an untrusted call gets a
    streaming handler that never reads its requests (a unary handler would have the whole
    message buffered first)."""

    def __init__(self, server: RpcServer) -> None:
        self._server = server

    def intercept_service(self, continuation: Callable[[Any], Any],
                          details: grpc.HandlerCallDetails) -> Any:
        method = details.method.rsplit("/", 1)[-1]
        reason = self._server.untrusted(method)
        if reason is None:
            return continuation(details)
        return grpc.stream_stream_rpc_method_handler(
            functools.partial(self._server.refuse_unread, method, reason))
