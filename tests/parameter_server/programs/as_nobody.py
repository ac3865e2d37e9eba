"""A forked child that calls a Unix socket as uid ``nobody`` (tests of the uid check)."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import time

import pytest


def send_as_nobody(path: str, request: bytes) -> int:
    """Connects to the worker's Unix socket as uid ``nobody`` in a forked child and sends the
    attack; returns how it ended: 3 = no access to the socket, 0 = closed unanswered,
    1 = answered."""
    nobody = pwd.getpwnam("nobody").pw_uid
    pid = os.fork()
    if pid == 0:  # the child: only socket calls, then _exit
        code = 9
        try:
            os.setuid(nobody)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(20)
            sock.connect(path)
            sock.sendall(len(request).to_bytes(8, "little") + request)
            code = 0 if sock.recv(8) == b"" else 1
        except PermissionError:
            code = 3
        except (ConnectionResetError, BrokenPipeError):
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the child running as nobody did not finish within 30 s")
