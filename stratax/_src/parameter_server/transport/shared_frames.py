"""Shared memory under a local-socket connection: frames move by one memcpy each way.

A frame sent over a Unix socket is copied by the kernel on both sides inside large system
calls; with a shared buffer the sender copies the frame in and the receiver copies it out, and
the socket carries only an 8-byte marker, which keeps the call's deadline and failure handling
as they are. What it saves per call is measured in docs/design/parameter_server.md, "The
same-host socket".

The client of a connection creates the buffer (an anonymous ``memfd``, sealed against shrinking
and growing, so the server can never fault on a truncated mapping), maps it, and passes its
descriptor to the server over the connection (``SCM_RIGHTS``) right after connecting; the
connection is already authenticated (same uid, the expected server pid: ``local_socket``).
Requests use the first half, replies the second; a connection carries one call at a time, so a
half is never written while its frame is read. A frame larger than a half goes over the socket
as before. The receiver copies a frame out before decoding it, so decoded tensors never alias
the buffer (a server keeps some of them, e.g. a created variable).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import struct
from collections.abc import Sequence
from typing import Any

SUPPORTED = (hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")
             and hasattr(socket, "send_fds"))
HALF_BYTES = 4 << 20  # frames up to this size use the buffer (the MLP's are 0.4 MB)
# The length word of a frame in the buffer: the high bit set, the frame's length below it.
IN_BUFFER = 1 << 63
# The first message of a connection that brings a buffer: this length word, with the descriptor.
HELLO = (1 << 63) | (1 << 62) | 0x5358
_SEALS = ("F_SEAL_SHRINK", "F_SEAL_GROW")
_LENGTH = struct.Struct("<Q")


class SharedFrames:
    """One connection's buffer: ``write(half, parts)`` and ``read(half, length)``.

    Example (both ends in one process, as in the tests):
      >>> frames = SharedFrames.create()                      # doctest: +SKIP
      >>> frames.write(0, [b"abc"]), frames.read(0, 3)        # doctest: +SKIP
      (3, bytearray(b'abc'))
    """

    def __init__(self, fd: int) -> None:
        self._map = mmap.mmap(fd, 2 * HALF_BYTES)  # keeps its own reference to the file
        self._view = memoryview(self._map)

    @classmethod
    def create(cls) -> tuple[SharedFrames, int]:
        """A new sealed buffer and its descriptor (to send to the server, then close)."""
        fd = os.memfd_create("stratax-frames", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, 2 * HALF_BYTES)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _seal_bits() | fcntl.F_SEAL_SEAL)
            return cls(fd), fd
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def adopt(cls, fd: int) -> SharedFrames:
        """The server's side of a client's buffer; ``ValueError`` if it is not one (unsealed,
        or not of the agreed size). Closes ``fd`` either way."""
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            size = os.fstat(fd).st_size
            if seals & _seal_bits() != _seal_bits() or size != 2 * HALF_BYTES:
                raise ValueError(f"a frame buffer must be a memfd of {2 * HALF_BYTES} bytes "
                                 f"sealed against resizing; got {size} bytes, seals {seals:#x}")
            return cls(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._view.release()
        with contextlib.suppress(BufferError):  # a reader's view still open: the GC frees it
            self._map.close()

    def write(self, half: int, parts: Sequence[Any]) -> int | None:
        """Copies a frame's buffers into ``half``; returns its length, or None (nothing
        written) when it does not fit."""
        views = [memoryview(p).cast("B") for p in parts]
        total = sum(len(v) for v in views)
        if total > HALF_BYTES:
            return None
        offset = half * HALF_BYTES
        for view in views:
            self._view[offset:offset + len(view)] = view
            offset += len(view)
        return total

    def read(self, half: int, length: int) -> bytearray:
        """A copy of the ``length``-byte frame in ``half`` (``ConnectionError`` if the length
        cannot be one)."""
        if length > HALF_BYTES:
            raise ConnectionError(f"a frame of {length} bytes announced in a {HALF_BYTES}-byte "
                                  "shared buffer")
        start = half * HALF_BYTES
        return bytearray(self._view[start:start + length])


def send_hello(sock: socket.socket) -> SharedFrames | None:
    """Client: creates a buffer and passes it to the server; None where this system cannot."""
    if not SUPPORTED:
        return None
    frames, fd = SharedFrames.create()
    try:
        socket.send_fds(sock, [_LENGTH.pack(HELLO)], [fd])
    except BaseException:
        frames.close()
        raise
    finally:
        os.close(fd)
    return frames


def receive_first(sock: socket.socket) -> tuple[SharedFrames | None, bytes]:
    """Server: reads a connection's first length word and, if it is a hello, adopts the buffer
    that came with it. Returns (buffer or None, the length word's bytes read so far: empty
    after a hello, else the start of the first frame)."""
    data, fds, _, _ = socket.recv_fds(sock, _LENGTH.size, 1)
    if data == _LENGTH.pack(HELLO) and len(fds) == 1:
        return SharedFrames.adopt(fds[0]), b""
    for fd in fds:  # descriptors with anything else are not ours to keep
        os.close(fd)
    return None, data


def _seal_bits() -> int:
    bits = 0
    for name in _SEALS:
        bits |= getattr(fcntl, name)
    return bits
