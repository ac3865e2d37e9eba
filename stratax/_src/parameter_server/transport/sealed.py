"""Frames between hosts: the local socket's ``wire`` frames over TCP, sealed with AES-128-GCM
under keys each connection gets over the cluster's mutual TLS.

Why: gRPC's TLS spends several times the cipher's own work on each byte, and plaintext gRPC
already costs more per call than these frames, which made the bandwidth-bound workloads of
``benchmarks.workloads.ps`` pay for their security (docs/design/parameter_server.md, Between
hosts). Here a frame is sealed in records of up to ``RECORD_BYTES``, straight from its tensors
into reused buffers, and opened straight into the frame's own buffer: the cipher's one pass.

Trust: keys come from the server in a ``Ticket`` gRPC call, which runs over mutual TLS keyed by
the cluster's token (``cluster_tls``), so only a task that holds the token gets any, and the
token never travels. A ticket is a random id and two fresh keys, one per direction, for one
connection made within ``TICKET_SECONDS``. A connection starts with the id in clear; the
server takes the ticket out of its table (an unknown or used id: the connection is closed
after those 16 bytes) and from then on every byte either way is sealed. A record's nonce is
its direction's count of records, which the receiver keeps itself, so a record altered,
dropped, replayed or moved fails authentication and the connection is closed. A listener at
the server's address without the token (a squatter on a dead task's port) sees a used id and
sealed bytes, and cannot answer with a record that authenticates: the client refuses it. A
key seals at most ``KEY_BYTES``; a client replaces a connection past half of that, and a
server drops one that goes past it.

Frame: a header record (the body's length, 8 bytes little-endian, sealed: 24 bytes), then the
body in records of ``min(RECORD_BYTES, rest)`` bytes, each followed by its 16-byte tag. Up to
``BATCH_BYTES`` of records go out, and come in, with one system call; a connection's buffers
grow with its frames up to that, on each side (the frame's own buffer aside).
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from stratax._src.core import env
from stratax._src.parameter_server.transport import wire
from stratax._src.parameter_server.transport.channel import FrameChannel
from stratax._src.parameter_server.transport.local_socket import (
    FrameRefused,
    recv_exact,
    time_left,
    tune,
)

RECORD_BYTES = 1 << 18
BATCH_BYTES = 4 << 20  # sealed records sent (and received) with one system call
TAG_BYTES = 16
ID_BYTES = 16
KEY_BYTES = 1 << 36
TICKET_SECONDS = 30.0
CONNECT_SECONDS = 3.0  # a first connection slower than this (a firewall) keeps calls on gRPC
_MAX_TICKETS = 1024
_BATCH_BODY = BATCH_BYTES // (RECORD_BYTES + TAG_BYTES) * RECORD_BYTES  # body bytes per batch
_LENGTH = struct.Struct("<Q")


class SealBroken(ConnectionError):
    """A record failed authentication (altered, dropped, replayed, or not sealed by the peer
    that holds this connection's key), or the key is used up: the connection is closed."""


class Sealer:
    """One connection's two keys and record counts: seals the frames it sends and opens the
    frames it receives.

    Example:
      >>> a, b = os.urandom(16), os.urandom(16)
      >>> client, server = Sealer(send_key=a, recv_key=b), Sealer(send_key=b, recv_key=a)
    """

    def __init__(self, send_key: bytes, recv_key: bytes) -> None:
        self._seal = AESGCM(send_key)
        self._open = AESGCM(recv_key)
        self._sent = self._received = 0  # records
        self.sent_bytes = self.received_bytes = 0
        self._out = bytearray()  # sealed records on their way out, up to BATCH_BYTES
        self._in = bytearray()   # sealed records received, up to BATCH_BYTES
        self._stage = bytearray(RECORD_BYTES)

    @property
    def worn(self) -> bool:
        """Past half of what either key may seal: a client connects anew."""
        return max(self.sent_bytes, self.received_bytes) > KEY_BYTES // 2

    def send_frame(self, sock: socket.socket, parts: Sequence[Any], end: float | None,
                   stall: float | None = None) -> None:
        """Seals and sends the frame made of ``parts`` by ``end`` (or, ``end`` None, with at
        most ``stall`` seconds for each batch of records)."""
        views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]
        total = sum(len(v) for v in views)
        if self.sent_bytes + total > KEY_BYTES:
            raise SealBroken("this connection's key is used up; connect anew")
        records = -(-total // RECORD_BYTES)
        out, used = self._out, 0
        sealed = _LENGTH.size + total + TAG_BYTES * (records + 1)
        if len(out) < min(sealed, BATCH_BYTES):  # grows with the frames, up to BATCH_BYTES
            out.extend(bytes(min(sealed, BATCH_BYTES) - len(out)))
        for record in itertools.chain([_LENGTH.pack(total)], _records(views, self._stage)):
            size = len(record) + TAG_BYTES
            if used + size > len(out):  # full: send the batch, start the next one
                _send(sock, memoryview(out)[:used], end, stall)
                used = 0
            self._seal.encrypt_into(_nonce(self._sent), record, None,
                                    memoryview(out)[used:used + size])
            self._sent += 1
            self.sent_bytes += len(record)
            used += size
        _send(sock, memoryview(out)[:used], end, stall)

    def recv_frame(self, sock: socket.socket, end: float | None, peer: str, limit: int,
                   stall: float | None = None) -> memoryview | None:
        """One frame, opened into a fresh buffer (decoded tensors are views of it); None on a
        clean end of stream. Its length must arrive by ``end``, the body by ``end`` too or
        with at most ``stall`` seconds between two pieces.

        Raises:
          FrameRefused: the frame is over ``limit`` bytes (nothing was allocated for it).
          SealBroken: a record failed authentication.
        """
        head = bytearray(_LENGTH.size + TAG_BYTES)
        if not recv_exact(sock, memoryview(head), end):
            return None
        word = bytearray(_LENGTH.size)
        self._open_record(memoryview(head), word, peer)
        (length,) = _LENGTH.unpack(word)
        if length > limit:
            raise FrameRefused(
                f"{peer} announced a frame of {length} bytes, over this task's limit of {limit} "
                f"bytes ({env.STRATAX_PS_MAX_FRAME_MIB}={limit >> 20})")
        if self.received_bytes + length > KEY_BYTES:
            raise SealBroken(f"{peer} went past what this connection's key may seal")
        data = memoryview(np.empty(length, np.uint8))  # committed as the records open
        body_end = None if stall is not None else end
        for first in range(0, length, _BATCH_BODY):
            starts = range(first, min(first + _BATCH_BODY, length), RECORD_BYTES)
            sizes = [min(RECORD_BYTES, length - start) for start in starts]
            sealed = sum(sizes) + TAG_BYTES * len(sizes)
            if len(self._in) < sealed:  # grows with the frames, up to BATCH_BYTES
                self._in.extend(bytes(sealed - len(self._in)))
            batch = memoryview(self._in)[:sealed]
            if not recv_exact(sock, batch, body_end, stall):
                raise ConnectionError("connection closed in the middle of a frame")
            at = 0
            for start, size in zip(starts, sizes, strict=True):
                self._open_record(batch[at:at + size + TAG_BYTES], data[start:start + size],
                                  peer)
                at += size + TAG_BYTES
        return data

    def _open_record(self, sealed: memoryview, into: Any, peer: str) -> None:
        try:
            self._open.decrypt_into(_nonce(self._received), sealed, None, into)
        except InvalidTag:
            raise SealBroken(
                f"a record from {peer} failed authentication: it was altered on the way, or "
                "the peer does not hold this connection's key (not the task that issued it: "
                "an impostor at its address?)") from None
        self._received += 1
        self.received_bytes += len(into)


def _send(sock: socket.socket, data: memoryview, end: float | None,
          stall: float | None) -> None:
    sock.settimeout(time_left(end) if end is not None else stall)
    sock.sendall(data)


def _nonce(count: int) -> bytes:
    return b"\0\0\0\0" + count.to_bytes(8, "big")


def _records(views: list[memoryview], stage: bytearray) -> Iterator[memoryview]:
    """``views`` joined and cut into records of ``RECORD_BYTES`` (the last one shorter): a
    record inside one view is a slice of it, one across views is copied into ``stage``."""
    index, offset = 0, 0
    while index < len(views):
        view = views[index]
        if len(view) - offset >= RECORD_BYTES or index == len(views) - 1:
            size = min(RECORD_BYTES, len(view) - offset)
            yield view[offset:offset + size]
            offset += size
        else:
            filled = 0
            while filled < RECORD_BYTES and index < len(views):
                view = views[index]
                size = min(RECORD_BYTES - filled, len(view) - offset)
                stage[filled:filled + size] = view[offset:offset + size]
                filled, offset = filled + size, offset + size
                if offset == len(view):
                    index, offset = index + 1, 0
            yield memoryview(stage)[:filled]
            continue
        if offset == len(view):
            index, offset = index + 1, 0


class Tickets:
    """The server's pending tickets: ``issue()`` (to a caller over TLS), ``take(id)`` (once,
    by the connection that presents it within ``TICKET_SECONDS``)."""

    def __init__(self) -> None:
        self._pending: dict[bytes, tuple[float, bytes, bytes]] = {}
        self._lock = threading.Lock()

    def issue(self) -> dict[str, str]:
        """A fresh id and keys (hex), for the ``Ticket`` call's reply."""
        ident, to_server, to_client = os.urandom(ID_BYTES), os.urandom(16), os.urandom(16)
        now = time.monotonic()
        with self._lock:
            for old in [k for k, (expires, *_) in self._pending.items() if expires < now]:
                del self._pending[old]
            if len(self._pending) >= _MAX_TICKETS:
                del self._pending[next(iter(self._pending))]  # the oldest
            self._pending[ident] = (now + TICKET_SECONDS, to_server, to_client)
        return {"id": ident.hex(), "to_server": to_server.hex(), "to_client": to_client.hex()}

    def take(self, ident: bytes) -> Sealer | None:
        """The server's sealer of the ticket ``ident``, which is used up; None if there is
        none (never issued, used, or expired)."""
        with self._lock:
            entry = self._pending.pop(bytes(ident), None)
        if entry is None or entry[0] < time.monotonic():
            return None
        return Sealer(send_key=entry[2], recv_key=entry[1])


class SealedChannel(FrameChannel):
    """The client side: sealed connections to one server's TCP port (see ``FrameChannel``),
    each keyed by a ticket from ``ticket(end)`` (the ``Ticket`` gRPC call). Connects once at
    construction: ``OSError`` then keeps the caller on gRPC.
    """

    def __init__(self, name: str, address: str, host: str, port: int,
                 ticket: Callable[[float], dict[str, Any]], timeout: float) -> None:
        super().__init__(f"{name} at {address}", f"{host}:{port} (sealed TCP)")
        self._target = (host, port)
        self._ticket = ticket
        self._sealers: dict[socket.socket, Sealer] = {}
        start = time.monotonic()
        self._idle.append((self._connect(start + min(timeout, CONNECT_SECONDS)), start))

    def _connect(self, end: float) -> socket.socket:
        ticket = self._ticket(end)
        try:
            ident = bytes.fromhex(ticket["id"])
            sealer = Sealer(send_key=bytes.fromhex(ticket["to_server"]),
                            recv_key=bytes.fromhex(ticket["to_client"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ConnectionRefusedError(f"{self._label} gave a malformed ticket: {err}") from None
        sock = socket.create_connection(self._target, timeout=time_left(end))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            tune(sock)
            sock.sendall(ident)
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._sealers[sock] = sealer
        return sock

    def _send(self, sock: socket.socket, parts: Sequence[Any], end: float) -> None:
        self._sealers[sock].send_frame(sock, parts, end)

    def _recv(self, sock: socket.socket, end: float) -> memoryview | None:
        return self._sealers[sock].recv_frame(sock, end, self._label, wire.MAX_FRAME_BYTES)

    def _reusable(self, sock: socket.socket) -> bool:
        return not self._sealers[sock].worn

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._sealers.pop(sock, None)

    def _reset_after_fork(self) -> None:
        super()._reset_after_fork()
        self._sealers = {}
