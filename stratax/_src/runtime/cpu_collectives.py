"""The CPU collectives between worker processes: which ones, and starting them once joined.

``runtime.distributed`` asks this module for the implementation before it joins the processes
(:func:`resolve`) and starts it after (:func:`start`); strategies then read the outcome through
``strategies.transport.choose``. Nothing else at this layer decides between gloo, MPI and the
shared-memory all-reduce.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.runtime import gloo_io, shm_collectives

_SHM_PEER_FAILURE = re.compile(
    r"stratax shared-memory all-reduce \(process \d+\): process (\d+) (.*?)\. ")


def resolve(explicit: str | None = None) -> str:
    """The CPU collectives JAX should use between processes: ``explicit``
    (``CommunicationOptions(implementation=...)``), else option ``cpu_collectives``
    (``sx.config``, ``STRATAX_CPU_COLLECTIVES``), else ``auto``.

    gloo (TCP, also between processes of one host) needs nothing installed; ``mpi`` is JAX's
    MPI collectives, which need an MPI library reachable through MPItrampoline
    (``MPITRAMPOLINE_LIB``; see docs/transport.md) and every worker started by ``mpirun``;
    ``shm`` is gloo plus stratax's shared-memory all-reduce for the packed collectives of
    processes on one host (``shm_collectives``); ``auto`` (the default) is ``shm`` when every
    process is on one host with one CPU device and the library builds, else gloo, agreed by all
    processes at start-up.

    Raises:
        ValueError: another implementation, or ``mpi`` without ``MPITRAMPOLINE_LIB``.
    """
    name = config.get("cpu_collectives", explicit)
    if name == "mpi" and not os.environ.get("MPITRAMPOLINE_LIB"):
        chosen = setting(explicit)
        raise ValueError(
            f"{chosen.asked} needs MPITRAMPOLINE_LIB set to an MPIwrapper library "
            f"(libmpiwrapper.so) built against your MPI; see docs/transport.md, or "
            f"{chosen.undo} for gloo.")
    return name


def setting(explicit: str | None = None) -> shm_collectives.Setting:
    """How the user chose the CPU collectives (``explicit``: ``CommunicationOptions``'
    ``implementation``), in the words an error should use to name that choice and to undo it."""
    name = config.get("cpu_collectives", explicit)
    origin = config.origin("cpu_collectives", explicit)
    if origin == "argument":
        return shm_collectives.Setting(
            f"CommunicationOptions(implementation={name!r})",
            "pass CommunicationOptions(implementation='auto')")
    if origin == "sx.config":
        return shm_collectives.Setting(
            f"sx.config cpu_collectives={name!r}",
            "call sx.config.update('cpu_collectives', 'auto')")
    return shm_collectives.Setting(f"{env.STRATAX_CPU_COLLECTIVES}={name}")


def start(name: str, process_id: int, num_processes: int, timeout_seconds: float,
          task_name: Callable[[int], str], gloo_priority: str,
          chosen: shm_collectives.Setting) -> None:
    """Starts collectives ``name`` once ``jax.distributed`` joined: JAX's backends with gloo's
    I/O thread at ``gloo_priority``, then, for ``shm`` and ``auto``, the shared-memory
    all-reduce that every process agrees on (``shm_collectives.setup``); its errors name
    ``chosen``, the setting that asked for ``shm`` (see :func:`setting`)."""
    if name != "mpi":
        gloo_io.start_backend(gloo_priority)
    if name in ("shm", "auto"):
        shm_collectives.setup(process_id, num_processes, timeout_seconds, task_name,
                              required=name == "shm", chosen=chosen)


def describe_peer_failure(text: str, task_name: Callable[[int], str]) -> str | None:
    """What a failed shared-memory all-reduce says about the peer that stopped (``"The
    shared-memory all-reduce failed: worker 1 (pid 42) exited"``), or ``None`` when ``text`` is
    not such a failure."""
    failure = _SHM_PEER_FAILURE.search(text)
    if failure is None:
        return None
    process = shm_collectives.state.process_of(int(failure.group(1)))
    return f"The shared-memory all-reduce failed: {task_name(process)} {failure.group(2)}"
