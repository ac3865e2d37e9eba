"""The server side of a framed transport: accepts connections on a listening socket, one
thread each, within a cap, and answers each request frame with ``dispatch(frame bytes)``.
``local_listener.LocalListener`` (same host) and ``sealed_listener.SealedListener`` (other
hosts) admit a connection and move frames their own way; the bounds and read deadlines are
``local_socket``'s docstring's.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.parameter_server.transport import wire
from stratax._src.parameter_server.transport.channel import IDLE_SECONDS
from stratax._src.parameter_server.transport.local_socket import FrameRefused
from stratax._src.parameter_server.transport.refusals import Refusals

logger = logging.getLogger(__name__)

# Read deadlines of the server's side of a connection (``local_socket``'s docstring).
FIRST_SECONDS = 10.0
STALL_SECONDS = 30.0
Receive = Callable[[float], Any]  # receive(end) -> frame bytes, or None at the stream's end
Send = Callable[[list[Any], bool], None]  # send(parts, refusal)


class FrameListener(abc.ABC):
    """Serves ``sock``: ``dispatch(frame bytes) -> reply bytes`` answers a request, and
    ``refuse(message) -> error frame`` a refused one. ``kind`` names the socket in logs."""

    def __init__(self, name: str, kind: str, sock: socket.socket,
                 dispatch: Callable[[Any], bytes], refuse: Callable[[str], bytes]) -> None:
        self.name = name
        self._kind = kind
        self._sock = sock
        self._dispatch = dispatch
        self._refuse = refuse  # the error frame answering a refused frame
        self._limit = min(config.ps_max_frame_mib << 20, wire.MAX_FRAME_BYTES)
        self._max_connections = config.ps_max_connections
        self._refused = Refusals()
        self._dropped = Refusals()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._stopping = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name=f"stratax-{name}-{kind}")

    @abc.abstractmethod
    def _admit(self, conn: socket.socket, address: Any) -> str | None:
        """The peer's name for logs if ``conn`` may be served, else None (it is closed)."""

    @abc.abstractmethod
    def _converse(self, conn: socket.socket, peer: str) -> None:
        """Serves ``conn`` until its peer ends it (with ``answer``)."""

    def start(self) -> None:
        self._acceptor.start()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops accepting, lets in-flight requests answer for ``grace`` seconds, and closes
        every connection (a second call does nothing)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            connections = dict(self._connections)
        _shutdown(self._sock, socket.SHUT_RDWR)  # wakes accept()
        if self._acceptor.ident is not None:
            self._acceptor.join(5.0)
        self._sock.close()
        for conn in connections:  # no more requests; a request being handled still answers
            _shutdown(conn, socket.SHUT_RD)
        end = time.monotonic() + (grace or 0.0)
        for thread in connections.values():
            if thread is not threading.current_thread():
                thread.join(max(end - time.monotonic(), 0.0))
        for conn, thread in connections.items():
            _shutdown(conn, socket.SHUT_RDWR)
            if thread is not threading.current_thread():
                thread.join(5.0)

    def _accept(self) -> None:
        while True:
            try:
                conn, address = self._sock.accept()
            except OSError as err:
                if self._stopping:
                    return
                logger.warning("%s: accepting a %s connection failed: %s", self.name,
                               self._kind, err)
                time.sleep(0.1)
                continue
            peer = self._admit(conn, address)
            if peer is None:
                conn.close()
                continue
            with self._lock:
                full = len(self._connections) >= self._max_connections
            if full:
                conn.close()
                count = self._refused.note()
                if count:
                    logger.warning("%s refused %d %s connection(s): %d are open, the limit "
                                   "(%s)", self.name, count, self._kind, self._max_connections,
                                   env.STRATAX_PS_MAX_CONNECTIONS)
                continue
            thread = threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                                      name=f"stratax-{self.name}-{self._kind}-{peer}")
            with self._lock:
                if self._stopping:
                    conn.close()
                    return
                self._connections[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        try:
            self._converse(conn, peer)
        except (OSError, ValueError) as err:
            count = 0 if self._stopping else self._dropped.note()
            if count:
                logger.warning("%s: dropped the connection of %s: %s (%d dropped since the "
                               "last such message)", self.name, peer, err, count)
        finally:
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()

    def answer(self, receive: Receive, send: Send) -> None:
        """Answers each frame ``receive`` gives until the stream ends; a refused frame is
        answered with the error frame, then the connection is dropped (``FrameRefused``)."""
        while True:
            try:
                data = receive(time.monotonic() + IDLE_SECONDS)
            except FrameRefused as err:
                send([self._refuse(str(err))], True)
                raise
            if data is None:
                return
            send([self._dispatch(data)], False)


def _shutdown(conn: socket.socket, how: int) -> None:
    with contextlib.suppress(OSError):  # already closed by its thread
        conn.shutdown(how)
