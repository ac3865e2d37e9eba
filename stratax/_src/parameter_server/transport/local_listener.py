"""The server side of the same-host transport (``local_socket``): a Unix socket in a private
directory, the peer's uid checked, served by ``frame_listener.FrameListener``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

from stratax._src.parameter_server.transport import frame_listener, shared_frames
from stratax._src.parameter_server.transport.frame_listener import FrameListener
from stratax._src.parameter_server.transport.local_socket import (
    MAX_PATH,
    host_identity,
    peer_credentials,
    recv_frame,
    send_frame,
    tune,
)

logger = logging.getLogger(__name__)

_PREFIX = "stratax-rpc-"  # then the server's pid: a killed server's directory is found later


class LocalListener(FrameListener):
    """A Unix socket in a private directory; only processes of this uid are served.

    Example:
      >>> listener = LocalListener("ps 0", dispatch, refuse)  # doctest: +SKIP
      >>> listener.start(); listener.endpoint()["path"]       # doctest: +SKIP
    """

    def __init__(self, name: str, dispatch: Callable[[Any], bytes],
                 refuse: Callable[[str], bytes]) -> None:
        self._uid = os.getuid()
        _remove_dead_directories()
        self.directory = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
        os.chmod(self.directory, 0o700)
        self.path = os.path.join(self.directory, "rpc.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if len(os.fsencode(self.path)) > MAX_PATH:
                raise OSError(f"socket path {self.path!r} is longer than {MAX_PATH} bytes")
            sock.bind(self.path)
            sock.listen(64)
        except OSError:
            sock.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        super().__init__(name, "local", sock, dispatch, refuse)

    def endpoint(self) -> dict[str, Any]:
        """What a client needs to decide whether it may connect (sent over gRPC)."""
        return {"path": self.path, "host": host_identity(), "pid": os.getpid(), "uid": self._uid}

    def stop(self, grace: float | None = 1.0) -> None:
        """``FrameListener.stop``, then removes the socket's directory."""
        super().stop(grace)
        shutil.rmtree(self.directory, ignore_errors=True)

    def _admit(self, conn: socket.socket, address: Any) -> str | None:
        pid, uid = peer_credentials(conn)
        if uid != self._uid:
            logger.warning("%s refused a local connection from pid %d running as uid %d "
                           "(only uid %d may connect)", self.name, pid, uid, self._uid)
            return None
        tune(conn)
        return f"local client pid {pid}"

    def _converse(self, conn: socket.socket, peer: str) -> None:
        shared = None
        try:
            conn.settimeout(frame_listener.FIRST_SECONDS)
            shared, head = shared_frames.receive_first(conn)
            if shared is None and not head:
                return
            first, stall = [head], frame_listener.STALL_SECONDS

            def receive(end: float) -> Any:
                head = first.pop() if first else b""
                return recv_frame(conn, end, peer, shared, 0, head, self._limit, stall)

            def send(parts: list[Any], refusal: bool) -> None:
                if refusal:
                    send_frame(conn, parts, time.monotonic() + stall)
                else:
                    conn.settimeout(stall)
                    send_frame(conn, parts, None, shared, 1)

            self.answer(receive, send)
        finally:
            if shared is not None:
                shared.close()


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
