"""worker_exit: SIGTERM handed back after joining, lent to a preemption notifier, and the prompt
exit after an uncaught exception. Each case runs in a fresh process (signals and excepthooks
are process-wide). JAX's notifier is a C handler that Python's ``signal`` module does not see;
SIG_IGN set through the C library inside ``joining`` stands in for it ("survived" = noticed)."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PRELUDE = f"""
import atexit, ctypes, os, signal, sys, time, types
pkg = types.ModuleType("stratax"); pkg.__path__ = [{str(REPO / "stratax")!r}]
sys.modules["stratax"] = pkg  # worker_exit needs nothing else from stratax
from stratax._src.runtime import worker_exit
libc = ctypes.CDLL(None)
libc.signal.argtypes, libc.signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
def notifier():
    libc.signal(signal.SIGTERM, 1)  # SIG_IGN behind Python's back, like JAX's C handler
def join():
    with worker_exit.joining("worker 1 (127.0.0.1:1)"):
        notifier()
"""


def _run(body: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(60)
def test_sigterm_ends_the_worker_after_joining():
    done = _run("""
        join()
        print("joined", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        print("SIGTERM was swallowed", flush=True)
    """)
    assert done.returncode == -signal.SIGTERM, done.stdout + done.stderr
    assert done.stdout == "joined\n"


@pytest.mark.timeout(60)
def test_a_handler_the_program_had_before_joining_is_kept():
    done = _run("""
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
        join()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    """)
    assert done.returncode == 7, done.stderr


@pytest.mark.timeout(60)
def test_sigterm_is_a_notice_only_while_routed_to_preemption():
    done = _run("""
        join()
        give_back = worker_exit.route_sigterm_to_preemption()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("survived", flush=True)
        give_back()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    """)
    assert done.stdout == "survived\n", done.stderr
    assert done.returncode == -signal.SIGTERM


@pytest.mark.timeout(60)
def test_nothing_to_route_without_a_notifier():
    done = _run("""
        with worker_exit.joining("worker 0"):
            pass
        print(worker_exit.route_sigterm_to_preemption())
    """)
    assert done.returncode == 0 and done.stdout == "None\n", done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error, code", [("RuntimeError('boom')", 1),
                                         ("KeyboardInterrupt()", 130)])
def test_uncaught_exception_exits_at_once_without_atexit(error, code):
    started = time.monotonic()
    done = _run(f"""
        join()
        atexit.register(lambda: (time.sleep(20), print("atexit ran", flush=True)))
        print("before", flush=True)
        raise {error}
    """)
    assert time.monotonic() - started < 15
    assert done.returncode == code, done.stderr
    assert done.stdout == "before\n"
    assert "Traceback (most recent call last):" in done.stderr
    name = error.split("(")[0]
    assert (f"stratax: worker 1 (127.0.0.1:1) exits with code {code} after an uncaught {name}, "
            "without waiting for the other workers") in done.stderr


@pytest.mark.timeout(60)
def test_a_failed_join_restores_sigterm_and_installs_no_hook():
    done = _run("""
        try:
            with worker_exit.joining("worker 1"):
                notifier()
                raise TimeoutError("no coordinator")
        except TimeoutError:
            pass
        print(sys.excepthook is sys.__excepthook__, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    """)
    assert done.stdout == "True\n", done.stderr
    assert done.returncode == -signal.SIGTERM
