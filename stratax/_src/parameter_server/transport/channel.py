"""The client side of a framed transport: a pool of connections to one server, each carrying
``wire`` frames in turn (a request, its reply). ``local_socket.LocalChannel`` (same host) and
``sealed.SealedChannel`` (other hosts) say how a connection is made and how a frame crosses it.
"""

from __future__ import annotations

import abc
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from stratax._src.core.errors import WorkerUnavailableError

logger = logging.getLogger(__name__)

# A server's idle deadline between requests; clients drop their connections idle for half that.
IDLE_SECONDS = 300.0


class SocketGone(ConnectionError):
    """No connection to the server's socket could be made, so nothing of the request was sent:
    the caller may ask the server (over gRPC) where it listens now and send it there."""


class FrameChannel(abc.ABC):
    """Connections to one server (an idle one is reused, a busy one is never shared, so
    concurrent calls from several threads each get their own). Subclasses make a connection
    (``_connect``) and move a frame across it (``_send``, ``_recv``); ``where`` names the
    server's socket in errors.
    """

    def __init__(self, label: str, where: str) -> None:
        self._label = label
        self.where = where
        self._lock = threading.Lock()
        self._idle: list[tuple[socket.socket, float]] = []  # with when each was last used
        self._closed = False
        self._owner = os.getpid()

    @abc.abstractmethod
    def _connect(self, end: float) -> socket.socket:
        """A new connection, ready for a request, by ``end`` (``OSError`` if none)."""

    @abc.abstractmethod
    def _send(self, sock: socket.socket, parts: Sequence[Any], end: float) -> None:
        """Sends the frame made of ``parts`` by ``end``."""

    @abc.abstractmethod
    def _recv(self, sock: socket.socket, end: float) -> memoryview | bytearray | None:
        """The reply frame by ``end``; None on a clean end of stream."""

    @abc.abstractmethod
    def _forget(self, sock: socket.socket) -> None:
        """Releases what this transport keeps for a connection that is being closed."""

    def _reusable(self, sock: socket.socket) -> bool:
        """Whether a connection that just answered may serve another call."""
        return True

    def _discard(self, sock: socket.socket) -> None:
        self._forget(sock)
        sock.close()

    def _reset_after_fork(self) -> None:
        """In a forked child: forgets the parent's connections (never shared)."""
        self._idle, self._owner = [], os.getpid()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock, _ in idle:
            self._discard(sock)

    def _take(self, end: float) -> tuple[socket.socket, bool]:
        """An idle connection the server has not closed (it closes them when it stops or
        dies, or after ``IDLE_SECONDS``: one idle for half that is dropped here first, so a
        request never meets that close), else a new one; ``SocketGone`` if none can be made.
        The flag says whether the connection was used before."""
        with self._lock:
            if self._owner != os.getpid():
                self._reset_after_fork()
            sock, used = self._idle.pop() if self._idle else (None, 0.0)
        if sock is not None and time.monotonic() - used > IDLE_SECONDS / 2:
            self._discard(sock)
            sock = None
        if sock is not None:
            sock.settimeout(0)
            try:
                sock.recv(1, socket.MSG_PEEK)  # b"": closed; bytes: out of turn, drop it too
            except BlockingIOError:
                return sock, True
            except OSError:
                pass
            self._discard(sock)
        try:
            return self._connect(end), False
        except OSError as err:
            raise SocketGone(f"{self._label} failed to connect to its socket {self.where} "
                             f"({type(err).__name__}: {err}: unreachable or died); check that "
                             "the task is running.") from None

    def call(self, parts: Sequence[Any], method: str,
             timeout: float) -> memoryview | bytearray:
        """Sends one request frame and returns the reply frame's bytes.

        Raises:
          SocketGone: no connection could be made (nothing was sent).
          WorkerUnavailableError: no reply within ``timeout`` seconds, or the connection was
            reset or closed (the connection is dropped: a late reply is never read by
            another call).
        """
        end = time.monotonic() + timeout
        sock, reused = self._take(end)
        # A reused connection the server closed before it read the request: sent again below.
        closed_before = (ConnectionResetError, BrokenPipeError) if reused else ()
        try:
            self._send(sock, parts, end)
            data = self._recv(sock, end)
            if data is None:
                raise ConnectionResetError("connection closed before the reply")
        except closed_before as err:
            # The server had closed this idle connection (after refusing a frame, or its idle
            # deadline) before it read the request: the request was not served; send it once
            # more on a new connection, as HTTP clients do on a kept-alive connection.
            logger.debug("%s: reused connection closed (%s); sending %r again", self._label,
                         err, method)
            self._discard(sock)
            return self.call(parts, method, max(end - time.monotonic(), 0.0))
        except TimeoutError:
            self._discard(sock)
            raise WorkerUnavailableError(
                f"{self._label} did not answer {method!r} within {timeout:g} s (socket "
                f"{self.where}); check that the task is running.") from None
        except OSError as err:
            self._discard(sock)
            raise WorkerUnavailableError(
                f"{self._label} failed {method!r} ({type(err).__name__}: {err}; socket "
                f"{self.where}: unreachable or died); check that the task is running.") from None
        with self._lock:
            keep = not self._closed and self._reusable(sock)
            if keep:
                self._idle.append((sock, time.monotonic()))
        if not keep:
            self._discard(sock)
        return data
