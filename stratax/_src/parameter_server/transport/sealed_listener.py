"""The server side of the transport between hosts (``sealed``): a TCP port beside the gRPC
port, at the same host address, served by ``frame_listener.FrameListener``. A connection is
served only if its first 16 bytes are the id of a ticket this server issued (``sealed``'s
docstring); nothing else is read from it before.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from stratax._src.parameter_server.transport import frame_listener, sealed
from stratax._src.parameter_server.transport.frame_listener import FrameListener
from stratax._src.parameter_server.transport.local_socket import recv_exact, tune
from stratax._src.parameter_server.transport.refusals import Refusals

logger = logging.getLogger(__name__)


class SealedListener(FrameListener):
    """A TCP port at ``host`` (chosen by the system, announced over TLS by ``Local``),
    serving connections that present a ticket from ``tickets``.

    Example:
      >>> tickets = sealed.Tickets()                                      # doctest: +SKIP
      >>> listener = SealedListener("ps 0", "10.0.0.5", tickets, dispatch, refuse)  # doctest: +SKIP
      >>> listener.start(); listener.port                                 # doctest: +SKIP
    """

    def __init__(self, name: str, host: str, tickets: sealed.Tickets,
                 dispatch: Callable[[Any], bytes], refuse: Callable[[str], bytes]) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((host, 0))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self._tickets = tickets
        self._unticketed = Refusals()
        super().__init__(name, "sealed", sock, dispatch, refuse)

    def _admit(self, conn: socket.socket, address: Any) -> str | None:
        return f"{address[0]}:{address[1]}"

    def _converse(self, conn: socket.socket, peer: str) -> None:
        ident = memoryview(bytearray(sealed.ID_BYTES))
        if not recv_exact(conn, ident, time.monotonic() + frame_listener.FIRST_SECONDS):
            return
        sealer = self._tickets.take(ident)
        if sealer is None:
            count = self._unticketed.note()
            if count:
                logger.warning("%s refused %d sealed connection(s) (the latest from %s) without "
                               "a ticket it issued", self.name, count, peer)
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tune(conn)
        stall = frame_listener.STALL_SECONDS

        def receive(end: float) -> Any:
            return sealer.recv_frame(conn, end, f"sealed client {peer}", self._limit, stall)

        def send(parts: list[Any], refusal: bool) -> None:
            sealer.send_frame(conn, parts, time.monotonic() + stall if refusal else None, stall)

        self.answer(receive, send)
