"""gloo's I/O thread yields its core: it runs under ``SCHED_IDLE``.

JAX's gloo transport has one I/O thread per process (``gloo::transport::tcp::Loop``) that
busy-polls ``epoll_wait`` while a collective is in flight (an early message keeps its socket
readable until the thread that waits for it posts the receive: thousands of calls per
all-reduce, counted in docs/design/performance.md).
When that poller shares a core with the thread that posts the receive (processes pinned to one
core each, or more busy threads than cores), the poster runs only at the next scheduler tick
(one tick of the kernel's clock), so every gloo collective cost a tick: `docs/design/transport.md`.
Under ``SCHED_IDLE`` the poller runs only when nothing else on its core is runnable, so the
poster runs at once.

The price: the I/O thread also moves gloo's bytes, so *other* processes that keep the same
cores busy slow gloo's collectives down (the thread still runs, with the smallest share of its
core). ``STRATAX_GLOO_IO_PRIORITY`` chooses: ``idle`` (the default), ``nice`` (nice 19: a
larger share under load, a smaller gain on idle cores) or ``normal`` (the default scheduling).
What each setting gives on idle and on busy cores, with the command: ``docs/design/performance.md``,
"Numbers behind the code's choices".

The thread has no name. It is the one thread that starting JAX's CPU backend creates that
waits in ``epoll`` (XLA's threads wait on futexes): :func:`start_backend` compares
``/proc/self/task`` before and after starting the backend.
"""

from __future__ import annotations

import logging
import os
import platform
import time

import jax

from stratax._src.core import env
from stratax._src.core.config import config

logger = logging.getLogger(__name__)

PRIORITIES = ("idle", "nice", "normal")
_FIND_SECONDS = 0.5  # how long a new thread may take to reach its first epoll_wait
# epoll_wait, epoll_pwait, epoll_pwait2 by machine, for kernels that hide /proc/*/wchan.
_EPOLL_SYSCALLS = {"x86_64": {"232", "281", "441"}, "aarch64": {"22", "441"}}


def io_priority() -> str:
    """Option ``gloo_io_priority`` (``STRATAX_GLOO_IO_PRIORITY``): ``idle`` (the default),
    ``nice`` or ``normal``.

    Raises:
        ValueError: another value, naming it and the choices.
    """
    return config.gloo_io_priority


def start_backend(priority: str = "idle") -> list[int]:
    """Starts JAX's backends and gives the gloo I/O thread they start ``priority``
    (:func:`io_priority`); returns the ids of the threads changed."""
    if priority == "normal" or not os.path.isdir("/proc/self/task"):
        jax.devices()
        return []
    before = set(_thread_ids())
    jax.devices()
    deadline = time.monotonic() + _FIND_SECONDS
    while True:
        pollers = [tid for tid in _thread_ids() if tid not in before and waits_in_epoll(tid)]
        if pollers or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    if not pollers:
        logger.debug("No new thread waits in epoll after the backend started; gloo's I/O "
                     "thread keeps the default scheduling.")
    return [tid for tid in pollers if deprioritize(tid, priority)]


def waits_in_epoll(tid: int) -> bool:
    """True when thread ``tid`` of this process is blocked in an ``epoll`` wait."""
    task = f"/proc/self/task/{tid}"
    try:
        with open(f"{task}/wchan") as f:
            wchan = f.read().strip()
        if wchan not in ("", "0"):
            return "epoll" in wchan
        with open(f"{task}/syscall") as f:
            number = f.read().split(maxsplit=1)[0]
    except (OSError, IndexError):
        return False
    return number in _EPOLL_SYSCALLS.get(platform.machine(), set())


def deprioritize(tid: int, priority: str) -> bool:
    """Puts thread ``tid`` under ``SCHED_IDLE`` (``"idle"``) or at nice 19 (``"nice"``); False
    (and a warning) where the system refuses."""
    try:
        if priority == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, tid, 19)
    except OSError as error:
        logger.warning("Cannot lower the priority of gloo's I/O thread (tid %d) to %s (%s); "
                       "gloo's collectives may cost a scheduler tick each on a busy core. Set "
                       "%s=normal to skip this.", tid, priority, error,
                       env.STRATAX_GLOO_IO_PRIORITY)
        return False
    logger.info("gloo's I/O thread (tid %d) runs at priority %s", tid, priority)
    return True


def _thread_ids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return []
