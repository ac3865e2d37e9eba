"""How a worker of a multi-process job ends: at once on an uncaught exception, and on SIGTERM.

Two behaviours of ``jax.distributed`` are wrong for a training job, and this module corrects
them from the moment a process joins a cluster (:func:`joining`):

1. **An exception ends the worker promptly.** At interpreter exit JAX's ``atexit`` hook shuts
   the distributed client down, which waits in a *shutdown barrier* for every other process (up
   to the shutdown timeout). After an uncaught exception on one worker the others are still
   training, so the failing worker sat in the barrier for minutes, then every process aborted
   with SIGABRT and the launcher quoted absl noise instead of the traceback. stratax installs a
   ``sys.excepthook`` that prints the traceback as usual, flushes the output, and ends the
   process with ``os._exit(1)`` (130 for ``KeyboardInterrupt``): no barrier; the peers'
   collectives then fail at once and ``stratax launch`` stops the group. Other ``atexit``
   handlers do not run on this path; a normal exit (and ``sys.exit``) still takes the barrier,
   which is what lets every worker leave together after a preemption.
2. **SIGTERM ends the worker.** JAX's preemption service installs a C++ SIGTERM handler that only
   records a preemption notice, so a plain ``kill`` or a Kubernetes eviction never ended a
   worker that had no preemption-aware callback. stratax puts back the program's own SIGTERM
   disposition right after joining (by default: terminate, exit status 128 + 15) and hands
   SIGTERM to JAX's notifier only through :func:`route_sigterm_to_preemption`, which
   ``sx.BackupAndRestore`` calls while it trains (all workers then agree on a step, save and
   exit with ``PREEMPTION_EXIT_CODE``).

The SIGTERM disposition is saved and restored as the C library's ``struct sigaction`` (opaque
bytes, through ``ctypes``): JAX's handler is a C function Python's ``signal`` module cannot
express, and the byte copy restores exactly what was there, Python handlers included.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

logger = logging.getLogger(__name__)

EXIT_ON_EXCEPTION = 1  # Python's own exit status for an uncaught exception
EXIT_ON_KEYBOARD_INTERRUPT = 128 + signal.SIGINT
_SIGACTION_BYTES = 1024  # larger than ``struct sigaction`` on every libc


def _libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sigaction  # noqa: B018 - probe: AttributeError where there is none
    except (OSError, AttributeError):
        return None
    return libc


class _State:
    """What this process changed when it joined (one per process)."""

    def __init__(self) -> None:
        self.name = "this worker"
        self.jax_sigterm: ctypes.Array[ctypes.c_char] | None = None
        self.previous_excepthook: Any = None
        self.lock = threading.Lock()
        self.libc: Any = _libc()


state = _State()


def _get_sigterm() -> ctypes.Array[ctypes.c_char] | None:
    """The current SIGTERM disposition as opaque bytes, or ``None`` without a usable libc."""
    if state.libc is None:
        return None
    action = ctypes.create_string_buffer(_SIGACTION_BYTES)
    if state.libc.sigaction(signal.SIGTERM, None, action) != 0:
        return None
    return action


def _handler(action: ctypes.Array[ctypes.c_char]) -> bytes:
    """The handler address, the first field of ``struct sigaction`` (the rest of the buffer may
    hold bytes the C library copies without meaning, so whole buffers are not compared)."""
    return action.raw[: ctypes.sizeof(ctypes.c_void_p)]


def _set_sigterm(action: ctypes.Array[ctypes.c_char]) -> None:
    if state.libc.sigaction(signal.SIGTERM, action, None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"sigaction(SIGTERM) failed: {os.strerror(error)}")


@contextlib.contextmanager
def joining(name: str) -> Iterator[None]:
    """Wraps ``jax.distributed.initialize``: afterwards SIGTERM is the program's again, and an
    uncaught exception ends the process without JAX's shutdown barrier.

    Args:
        name: this process in messages, e.g. ``"worker 1 (127.0.0.1:1234)"``.
    """
    before = _get_sigterm()
    try:
        yield
    except BaseException:
        if before is not None:
            _set_sigterm(before)
        raise
    state.name = name
    if before is not None:
        after = _get_sigterm()
        if after is not None and _handler(after) != _handler(before):
            state.jax_sigterm = after  # JAX's preemption notifier
            _set_sigterm(before)
    else:
        logger.warning("Cannot save the SIGTERM handler here (no sigaction through ctypes); "
                       "JAX's preemption notifier keeps SIGTERM, so SIGTERM will not end %s.",
                       name)
    _install_excepthook()


def route_sigterm_to_preemption() -> Callable[[], None] | None:
    """Hands SIGTERM to JAX's preemption notifier; returns the function that takes it back.

    Called by preemption-aware callbacks such as ``sx.BackupAndRestore`` when they start
    training: a SIGTERM then becomes a notice that
    ``multihost_utils.reached_preemption_sync_point`` reports on every worker at the same step.
    Calling the returned function (when training ends) restores the disposition found here, so
    SIGTERM ends the worker again. Returns ``None`` when this process has no JAX notifier (one
    process, or JAX's preemption service disabled).
    """
    with state.lock:
        jax_action = state.jax_sigterm
        program = _get_sigterm() if jax_action is not None else None
        if jax_action is None or program is None:
            return None
        _set_sigterm(jax_action)

    def restore() -> None:
        with state.lock:
            _set_sigterm(program)

    return restore


class SigtermNotice:
    """SIGTERM as a preemption notice while a preemption-aware callback trains, until
    :meth:`give_back` restores what SIGTERM did before.

    Several processes: SIGTERM goes to JAX's preemption notifier (every worker hears it at one
    step; ``routed`` tells whether this process has that notifier). One process, on the main
    thread: SIGTERM sets ``notice``. Elsewhere SIGTERM is left as it is.

    Example:
        >>> notice = threading.Event()
        >>> watch = SigtermNotice(multi_process=False, notice=notice)  # doctest: +SKIP
        >>> watch.give_back()  # doctest: +SKIP
    """

    def __init__(self, multi_process: bool, notice: threading.Event) -> None:
        self._give_back: Callable[[], Any] | None = None
        if multi_process:
            self._give_back = route_sigterm_to_preemption()
        elif threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, lambda *_: notice.set())
            self._give_back = lambda: signal.signal(signal.SIGTERM, previous)
        self.routed = multi_process and self._give_back is not None

    def give_back(self) -> None:
        """SIGTERM does again what it did before (once; later calls do nothing)."""
        give_back, self._give_back = self._give_back, None
        if give_back is not None:
            give_back()


def _install_excepthook() -> None:
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return  # an interactive session survives its exceptions
    if state.previous_excepthook is None:
        state.previous_excepthook = sys.excepthook
        sys.excepthook = _exit_after_traceback


def _exit_after_traceback(exc_type: type[BaseException], exc: BaseException,
                          tb: TracebackType | None) -> None:
    """Prints the traceback (through the previous hook), then ends the process at once."""
    try:
        (state.previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)
    finally:
        code = (EXIT_ON_KEYBOARD_INTERRUPT if issubclass(exc_type, KeyboardInterrupt)
                else EXIT_ON_EXCEPTION)
        with contextlib.suppress(Exception):
            # An error record: Python's last-resort handler prints it where logging is not set up.
            logger.error("stratax: %s exits with code %d after an uncaught %s, without waiting "
                         "for the other workers in jax.distributed's shutdown barrier.",
                         state.name, code, exc_type.__name__)
        with contextlib.suppress(Exception):
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
