"""gRPC's lines for refused TLS peers, rate-limited: one line per interval, with a count.

Why: gRPC core logs one line per failed TLS handshake (``ssl_transport_security.cc:NNNN]
Handshake failed with error ...``) from C++ straight to the process' stderr, where Python's
logging cannot reach it. Every peer that does not hold the cluster's key fails the handshake (a
port scanner, a task of another cluster, an attacker at a task's port), so a flood of them
would flood the task's log as well (and its disk). A served task (``install``, called by
``serve``) routes its stderr through a small filter process that passes every other byte on
unchanged and replaces those lines with at most one per ``every_seconds``, counting the others,
as the local-socket server does for the clients it drops::

    stratax: refused a TLS handshake (a peer without this cluster's key): SSL_ERROR_SSL: ...
    (12 refused since the last such message)

gRPC's line names no peer address (and gRPC calls no Python code for a failed handshake), so the
count is per task, not per peer. A line of another shape (another gRPC version) passes unchanged.

The filter is a process, not a thread: it outlives a crash of the task, so the task's last
words (a traceback, faulthandler's dump) still reach the log, and it leaves the task's process
group (a launcher's SIGTERM to the group does not end it first); it ends when every writer of
the pipe has closed it (the task and the children that inherited its stderr).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

from stratax._src.parameter_server.transport.refusals import Refusals

_GRPC_LINE = re.compile(rb"[IWEF]\d{4} [^\]\n]*ssl_transport_security\.cc:\d+\] "
                        rb"Handshake failed with error (?P<why>[^\n]*)\n")
# What a gRPC log line can start with: a partial line that could still become one is held
# until its end; any other partial line (a prompt, a progress bar) passes at once.
_GRPC_START = re.compile(rb"[IWEF](\d{0,3}|\d{4} .*)")
_filter: subprocess.Popen | None = None
logger = logging.getLogger(__name__)


def install(every_seconds: float = 10.0) -> None:
    """Routes this process' stderr (file descriptor 2) through the filter; once per process.

    Call only in a process that serves a task (it replaces the descriptor every library and
    child process writes to), before its gRPC server sees peers."""
    global _filter
    if _filter is not None:
        return
    sys.stderr.flush()
    read, write = os.pipe()
    try:
        _filter = subprocess.Popen(
            [sys.executable, "-m", __name__, str(every_seconds)], stdin=read, stdout=2,
            stderr=2, start_new_session=True)
    except OSError as err:  # the task serves all the same, with gRPC's lines as they are
        os.close(write)
        logger.warning("gRPC's lines for refused TLS peers are not rate-limited: the filter "
                       "process did not start (%s)", err)
        return
    finally:
        os.close(read)
    os.dup2(write, 2)
    os.close(write)


def _run(source: int, sink: int, every_seconds: float) -> None:
    """The filter: copies ``source`` to ``sink`` until end of file, gRPC's handshake-failure
    lines rate-limited."""
    refusals = Refusals(every_seconds)
    pending = b""
    while chunk := os.read(source, 1 << 16):
        pending += chunk
        out = bytearray()
        start = 0
        for line in _GRPC_LINE.finditer(pending):
            if line.start() and pending[line.start() - 1:line.start()] != b"\n":
                continue  # not at a line's start: someone's text that quotes gRPC
            out += pending[start:line.start()]
            start = line.end()
            count = refusals.note()
            if count:
                out += _summary(line["why"], count)
        tail = pending[start:]
        last_line = tail.rfind(b"\n") + 1
        out += tail[:last_line]
        pending = tail[last_line:]
        if not _GRPC_START.fullmatch(pending):
            out += pending
            pending = b""
        _write_all(sink, bytes(out))
    _write_all(sink, pending)
    count = refusals.unreported()
    if count:
        _write_all(sink, f"stratax: refused {count} more TLS handshake(s) (peers without this "
                         "cluster's key) since the last such message\n".encode())


def _summary(why: bytes, count: int) -> bytes:
    return (b"stratax: refused a TLS handshake (a peer without this cluster's key): " + why
            + f" ({count} refused since the last such message)\n".encode())


def _write_all(sink: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(sink, view):]


if __name__ == "__main__":
    _run(0, 1, float(sys.argv[1]))
