"""The server side of the same-host transport (``local_socket``): a Unix socket in a private
directory, the peer's uid checked, one thread per connection, within the bounds and read
deadlines ``local_socket``'s docstring lists.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.parameter_server.transport import shared_frames, wire
from stratax._src.parameter_server.transport.local_socket import (
    IDLE_SECONDS,
    MAX_PATH,
    FrameRefused,
    host_identity,
    peer_credentials,
    recv_frame,
    send_frame,
    tune,
)
from stratax._src.parameter_server.transport.refusals import Refusals

logger = logging.getLogger(__name__)

_PREFIX = "stratax-rpc-"  # then the server's pid: a killed server's directory is found later
# Read deadlines of the server's side of a connection (``local_socket``'s docstring).
_FIRST_SECONDS = 10.0
_STALL_SECONDS = 30.0


class LocalListener:
    """The server side: a Unix socket in a private directory, one thread per connection, each
    request answered by ``dispatch(frame bytes) -> reply bytes``, and a refused frame by
    ``refuse(message) -> error frame``.

    Example:
      >>> listener = LocalListener("ps 0", dispatch)     # doctest: +SKIP
      >>> listener.start(); listener.endpoint()["path"]  # doctest: +SKIP
    """

    def __init__(self, name: str, dispatch: Callable[[Any], bytes],
                 refuse: Callable[[str], bytes]) -> None:
        self.name = name
        self._dispatch = dispatch
        self._refuse = refuse  # the error frame answering a refused frame
        self._limit = min(config.ps_max_frame_mib << 20, wire.MAX_FRAME_BYTES)
        self._max_connections = config.ps_max_connections
        self._refused = Refusals()
        self._dropped = Refusals()
        self._uid = os.getuid()
        _remove_dead_directories()
        self.directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
        os.chmod(self.directory, 0o700)
        self.path = os.path.join(self.directory, "rpc.sock")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if len(os.fsencode(self.path)) > MAX_PATH:
                raise OSError(f"socket path {self.path!r} is longer than {MAX_PATH} bytes")
            self._sock.bind(self.path)
            self._sock.listen(64)
        except OSError:
            self._sock.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._stopping = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name=f"stratax-{name}-local")

    def endpoint(self) -> dict[str, Any]:
        """What a client needs to decide whether it may connect (sent over gRPC)."""
        return {"path": self.path, "host": host_identity(), "pid": os.getpid(), "uid": self._uid}

    def start(self) -> None:
        self._acceptor.start()

    def stop(self, grace: float | None = 1.0) -> None:
        """Stops accepting, lets in-flight requests answer for ``grace`` seconds, closes every
        connection and removes the socket's directory (a second call does nothing)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            connections = dict(self._connections)
        self._sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
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
        shutil.rmtree(self.directory, ignore_errors=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError as err:
                if self._stopping:
                    return
                logger.warning("%s: accepting a local connection failed: %s", self.name, err)
                time.sleep(0.1)
                continue
            pid, uid = peer_credentials(conn)
            if uid != self._uid:
                logger.warning("%s refused a local connection from pid %d running as uid %d "
                               "(only uid %d may connect)", self.name, pid, uid, self._uid)
                conn.close()
                continue
            with self._lock:
                full = len(self._connections) >= self._max_connections
            if full:
                conn.close()
                count = self._refused.note()
                if count:
                    logger.warning("%s refused %d local connection(s): %d are open, the limit "
                                   "(%s)", self.name, count, self._max_connections,
                                   env.STRATAX_PS_MAX_CONNECTIONS)
                continue
            tune(conn)
            thread = threading.Thread(target=self._serve, args=(conn, pid), daemon=True,
                                      name=f"stratax-{self.name}-local-{pid}")
            with self._lock:
                if self._stopping:
                    conn.close()
                    return
                self._connections[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket, pid: int) -> None:
        peer = f"local client pid {pid}"
        shared = None
        try:
            conn.settimeout(_FIRST_SECONDS)
            shared, head = shared_frames.receive_first(conn)
            if shared is None and not head:
                return
            while True:
                try:
                    data = recv_frame(conn, time.monotonic() + IDLE_SECONDS, peer, shared, 0,
                                       head, self._limit, _STALL_SECONDS)
                except FrameRefused as err:
                    send_frame(conn, [self._refuse(str(err))], time.monotonic() + _STALL_SECONDS)
                    raise
                head = b""
                if data is None:
                    return
                reply = self._dispatch(data)
                conn.settimeout(_STALL_SECONDS)
                send_frame(conn, [reply], None, shared, 1)
        except (OSError, ValueError) as err:
            count = 0 if self._stopping else self._dropped.note()
            if count:
                logger.warning("%s: dropped the connection of %s: %s (%d dropped since the "
                               "last such message)", self.name, peer, err, count)
        finally:
            if shared is not None:
                shared.close()
            with self._lock:
                self._connections.pop(conn, None)
            conn.close()


def _remove_dead_directories() -> None:
    """Removes the socket directories, owned by this uid, of servers that died without
    stopping (SIGKILL), so they do not pile up in the temporary directory."""
    root = tempfile.gettempdir()
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            pid = entry.name[len(_PREFIX):].split("-", 1)[0]
            if not entry.name.startswith(_PREFIX) or not pid.isdigit():
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(entry.path, ignore_errors=True)
            except OSError:
                continue


def _shutdown(conn: socket.socket, how: int) -> None:
    with contextlib.suppress(OSError):  # already closed by its thread
        conn.shutdown(how)
