"""Same-host transport: ``wire`` frames over a Unix domain socket, beside a server's gRPC port.

Why: on one box the parameter servers, workers and chief share a few cores, and Python gRPC
spends milliseconds of CPU per call (client and server) on a frame of a few hundred KB; a Unix
socket moves the same frame with a few system calls (figures in docs/design/performance.md).
``RpcClient`` uses this path when the server runs on the same host (learned over gRPC, see
``RpcServer``), gRPC otherwise; ``STRATAX_PS_TRANSPORT=grpc`` turns it off.

The server's side is ``local_listener``; this module holds the client's side and the framing
both use.

Protocol: a connection carries requests and replies in turn, each an 8-byte little-endian
length followed by one wire frame (at most ``wire.MAX_FRAME_BYTES``). Unless
``STRATAX_PS_TRANSPORT=socket``, a client first passes the server a shared buffer
(``shared_frames``), and frames that fit in it travel there, the socket carrying only their
length word (its high bit set).

Security: the socket lives in a private directory (``mkdtemp``, mode 0700, removed on stop), and
the server accepts a connection only from a process of its own uid (``SO_PEERCRED``): that is
the authentication of this path (a process of the same uid can read the token anyway). A client
connects only to a path the server named over gRPC (a call that carries the token when one is
set), on a host with the same identity (boot id, hostname, network namespace), in a private
directory it owns, and only if the process listening there is the one that named it (pid and
uid from ``SO_PEERCRED``); anything else keeps the call on gRPC.

Bounds (a buggy or hostile client of the same uid must not exhaust the task): a frame larger
than ``ps_max_frame_mib`` (``STRATAX_PS_MAX_FRAME_MIB``) is answered with the wire's error and
the connection closed, and a frame's buffer is committed only as its bytes arrive (an
announced length costs no memory); a connection gets ``frame_listener.FIRST_SECONDS`` for its
first bytes, ``IDLE_SECONDS`` between requests (clients drop their idle connections at half
that) and ``frame_listener.STALL_SECONDS`` between two pieces of a frame or of its reply; at most
``ps_max_connections`` (``STRATAX_PS_MAX_CONNECTIONS``) connections, one thread each, are served
at once, and more are closed at once (the refusals logged at most once per 10 s).
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.parameter_server.transport import shared_frames, wire
from stratax._src.parameter_server.transport.channel import FrameChannel
from stratax._src.parameter_server.transport.shared_frames import SharedFrames

TRANSPORTS = ("auto", "socket", "tcp", "grpc")
SUPPORTED = hasattr(socket, "AF_UNIX") and hasattr(socket, "SO_PEERCRED")
_LENGTH = struct.Struct("<Q")
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_PATH = 107  # sun_path holds 108 bytes with the terminating NUL
_IOV = 512  # buffers per sendmsg (Linux' IOV_MAX is 1024)
_BUFFER_BYTES = 4 << 20  # socket buffers asked for (the kernel caps them at its maximum)


class FrameRefused(ConnectionError):
    """A peer announced a frame this side will not take (over the limit, or in a shared buffer
    it never gave or cannot hold): answered with an error, then the connection is closed (its
    stream of frames is out of step)."""


def transport_mode(value: str | None = None) -> str:
    """The transport setting: ``value``, else ``STRATAX_PS_TRANSPORT``, else ``"auto"``.

    Raises:
      ValueError: the setting is not one of ``TRANSPORTS``.
    """
    source = "transport" if value is not None else env.STRATAX_PS_TRANSPORT
    mode = value if value is not None else config.ps_transport
    if mode not in TRANSPORTS:
        raise ValueError(
            f"{source}={mode!r} is not a parameter-server transport; use 'auto' (a Unix socket "
            "and shared memory to servers on the same host, sealed TCP to the others), 'socket' "
            "(the same without shared memory), 'tcp' (sealed TCP to every server) or 'grpc' "
            "(always gRPC).")
    return mode


def host_identity() -> str | None:
    """This machine's boot id, hostname and network namespace (None where the kernel gives no
    boot id). Processes in two network namespaces count as two hosts: that is how hosts are
    emulated on one box (``benchmarks/cluster/netns.py``), and their traffic must stay on the
    network."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
        net = os.readlink("/proc/self/ns/net")
    except OSError:
        return None
    return f"{boot}/{socket.gethostname()}/{net}" if boot else None


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """``(pid, uid)`` of the process at the other end of a connected Unix socket."""
    pid, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               _CRED.size))
    return pid, uid


def time_left(end: float | None) -> float | None:
    """Seconds until ``end`` (None: no deadline); ``TimeoutError`` once it has passed."""
    if end is None:
        return None
    left = end - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def recv_exact(sock: socket.socket, view: memoryview, end: float | None,
               stall: float | None = None) -> bool:
    """Fills ``view`` from ``sock`` by ``end``, or (``end`` None) with at most ``stall``
    seconds between two pieces; False on a clean end of stream before the first byte."""
    got = 0
    if end is None and stall is not None:
        sock.settimeout(stall)
    while got < len(view):
        if end is not None:
            sock.settimeout(time_left(end))
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return False
            raise ConnectionError("connection closed in the middle of a frame")
        got += n
    return True


def recv_frame(sock: socket.socket, end: float | None, peer: str,
                shared: SharedFrames | None = None, half: int = 0, head: bytes = b"",
                limit: int = wire.MAX_FRAME_BYTES,
                stall: float | None = None) -> memoryview | bytearray | None:
    """One length-prefixed frame into a fresh buffer (decoded tensors are views of it, which a
    receiver may keep): from the socket, or copied out of ``shared``'s ``half`` when the
    length word says so; None on a clean end of stream. ``head``: the length word's first
    bytes, already read. The length word must arrive by ``end``; the body too, or with
    ``stall``, with at most that many seconds between two pieces.

    Raises:
      FrameRefused: the frame is over ``limit`` bytes, or in a shared buffer that cannot
        hold it; nothing was allocated for it.
    """
    word = bytearray(head) + bytearray(_LENGTH.size - len(head))
    if not recv_exact(sock, memoryview(word)[len(head):], end) and not head:
        return None
    (length,) = _LENGTH.unpack(word)
    in_buffer = bool(length & shared_frames.IN_BUFFER)
    length &= ~shared_frames.IN_BUFFER
    if length > limit:
        raise FrameRefused(
            f"{peer} announced a frame of {length} bytes, over this task's limit of {limit} "
            f"bytes ({env.STRATAX_PS_MAX_FRAME_MIB}={limit >> 20})")
    if in_buffer:
        if shared is None or length > shared_frames.HALF_BYTES:
            raise FrameRefused(f"{peer} announced a frame of {length} bytes in a shared buffer "
                               "it never gave or that cannot hold it")
        return shared.read(half, length)
    # Uninitialised memory: pages are committed as the bytes arrive, so a length announced
    # and never sent costs nothing (a zeroed bytearray would commit all of it at once).
    data = memoryview(np.empty(length, np.uint8))
    if not recv_exact(sock, data, None if stall is not None else end, stall) and length:
        raise ConnectionError("connection closed before the frame's body")
    return data


def send_frame(sock: socket.socket, parts: Sequence[Any], end: float | None,
                shared: SharedFrames | None = None, half: int = 0) -> None:
    """Sends the length prefix and ``parts`` with ``sendmsg`` (no join of the frame), however
    many calls the kernel's buffer takes; with ``shared``, a frame that fits goes into its
    ``half`` and only the length word (marked) goes over the socket."""
    length = shared.write(half, parts) if shared is not None else None
    if length is not None:
        parts = [_LENGTH.pack(shared_frames.IN_BUFFER | length)]
        if end is not None:
            sock.settimeout(time_left(end))
        sock.sendall(parts[0])
        return
    views = [memoryview(p).cast("B") for p in parts]
    views = [memoryview(_LENGTH.pack(sum(len(v) for v in views))), *(v for v in views if len(v))]
    while views:
        if end is not None:
            sock.settimeout(time_left(end))
        sent = sock.sendmsg(views[:_IOV])
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def tune(sock: socket.socket) -> None:
    """Asks for large socket buffers: a megabyte frame in few system calls."""
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, _BUFFER_BYTES)


class LocalChannel(FrameChannel):
    """The client side: connections to one server's socket (see ``FrameChannel``).

    Built only from an endpoint that passes every check (see the module docstring); raises
    ``OSError`` or ``ValueError`` otherwise, and the caller stays on gRPC. With ``shared``
    (default where the system allows), each connection brings the server a shared buffer for
    its frames (``shared_frames``).
    """

    def __init__(self, name: str, address: str, endpoint: dict[str, Any],
                 timeout: float, shared: bool = True) -> None:
        self.path = _checked_path(endpoint)
        super().__init__(f"{name} at {address}", self.path)
        self._pid = endpoint["pid"]
        self._shared = shared and shared_frames.SUPPORTED
        self._frames: dict[socket.socket, SharedFrames] = {}  # each connection's buffer
        self._idle.append((self._connect(time.monotonic() + timeout), time.monotonic()))

    def _connect(self, end: float) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(time_left(end))
            sock.connect(self.path)
            pid, uid = peer_credentials(sock)
            if (pid, uid) != (self._pid, os.getuid()):
                raise ConnectionRefusedError(
                    f"{self.path} is served by pid {pid} as uid {uid}, not by pid {self._pid} "
                    f"as uid {os.getuid()}")
            tune(sock)
            frames = shared_frames.send_hello(sock) if self._shared else None
        except BaseException:
            sock.close()
            raise
        if frames is not None:
            with self._lock:
                self._frames[sock] = frames
        return sock

    def _send(self, sock: socket.socket, parts: Sequence[Any], end: float) -> None:
        send_frame(sock, parts, end, self._frames.get(sock), 0)

    def _recv(self, sock: socket.socket, end: float) -> memoryview | bytearray | None:
        return recv_frame(sock, end, self._label, self._frames.get(sock), 1)

    def _forget(self, sock: socket.socket) -> None:
        """Unmaps the connection's shared buffer."""
        with self._lock:
            frames = self._frames.pop(sock, None)
        if frames is not None:
            frames.close()

    def _reset_after_fork(self) -> None:
        super()._reset_after_fork()
        self._frames = {}


def _checked_path(endpoint: dict[str, Any]) -> str:
    """The endpoint's socket path if the server is on this host, runs as this uid and keeps
    the socket in a private directory this uid owns; else ``ValueError`` saying why."""
    path, host, uid = endpoint.get("path"), endpoint.get("host"), endpoint.get("uid")
    if not isinstance(path, str) or type(endpoint.get("pid")) is not int:
        raise ValueError(f"the server offers no local socket ({endpoint!r})")
    here = host_identity()
    if here is None or host != here:
        raise ValueError(f"the server is on another host ({host!r}, this is {here!r})")
    if uid != os.getuid():
        raise ValueError(f"the server runs as uid {uid!r}, this process as {os.getuid()}")
    if (not os.path.isabs(path) or os.path.normpath(path) != path or "\0" in path
            or len(os.fsencode(path)) > MAX_PATH):
        raise ValueError(f"{path!r} is not an absolute, normal socket path")
    folder = os.lstat(os.path.dirname(path))
    if (not stat.S_ISDIR(folder.st_mode) or folder.st_uid != os.getuid()
            or folder.st_mode & 0o077):
        raise ValueError(f"{os.path.dirname(path)!r} is not a private directory of this uid")
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise ValueError(f"{path!r} is not a socket")
    return path
