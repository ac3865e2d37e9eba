"""A same-host all-reduce over POSIX shared memory (``STRATAX_CPU_COLLECTIVES=shm``).

Between CPU processes on one host, gloo's TCP all-reduce costs a scheduler tick when each
process is pinned to one core (docs/design/transport.md). With ``shm`` the packed all-reduces of
``fit``'s step and of ``ctx.all_reduce`` run instead as an XLA FFI custom call
(``csrc/shm_allreduce.cc``, compiled on first use by :mod:`shm_build`): each process copies its
buffer into its slot of one shared segment, waits at a sequence-numbered barrier, and sums every
slot in rank order, so all processes get bit-identical results, as with ``psum``. Every other
collective (XLA's own, ``all_gather``, unsupported dtypes) still goes through gloo.

This module sets the segment up and holds its state; the custom calls themselves are
``shm_calls``'s.

Set-up, once per process after ``jax.distributed`` joined (:func:`setup`): every process checks
that it is on the same host as process 0 (Linux) with one local CPU device and that it could
build the library, and publishes the verdict in the coordination service's key-value store;
process 0 creates the segment, publishes its name, waits until every process mapped it, and
unlinks the name at once, so nothing is left in ``/dev/shm`` even if a process is killed. With
``STRATAX_CPU_COLLECTIVES`` unset (``auto``) the same verdicts choose between shm and gloo
without an error; with ``shm`` an impossible set-up is an error.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from stratax._src import seam
from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.core.errors import CollectiveTimeoutError
from stratax._src.runtime import host_groups, shm_build

logger = logging.getLogger(__name__)

TARGET = "stratax_shm_all_reduce"
# The all-gather and reduce-scatter of fit's sharded update: the same handler under another
# name, so that counting and rewriting all-reduces (unordered_if_alone) leaves them alone.
EXCHANGE_TARGET = "stratax_shm_exchange"
OPS = {"sum": 0, "max": 1, "min": 2}
DTYPES = frozenset(np.dtype(d) for d in ("float32", "float64", "int32", "int64", "uint32"))
# Rounds of 1 MiB keep a round's data in cache, so a large all-reduce runs in several rounds
# rather than one (docs/design/performance.md, "Numbers behind the code's choices").
DEFAULT_SLOT_BYTES = config.option("shm_slot_bytes").default
# A waiting process spins this long before it sleeps on a futex. Where processes share cores:
# long enough for a peer on another core, short enough to hand the core to a peer on this one.
SHARED_CORES_SPIN_US = 50.0
# Where every process has a core of its own: on a virtual machine a core that sleeps can lose
# its physical CPU to another guest, and the wake-up then waits for it; the peer waits for
# this process at the next step, and so on (measured in docs/design/performance.md, "Numbers
# behind the code's choices"). The spin yields the core now and then, so the process's own
# threads still get it.
OWN_CORES_SPIN_US = 1e6
_KEY = "stratax/shm"


@dataclasses.dataclass(frozen=True)
class Setting:
    """The setting that asked for ``shm``, as the errors saying it cannot be had name it:
    ``asked`` (e.g. ``CommunicationOptions(implementation='shm')``) and ``undo``, what to do
    instead for gloo."""

    asked: str = f"{env.STRATAX_CPU_COLLECTIVES}=shm"
    undo: str = f"unset {env.STRATAX_CPU_COLLECTIVES}"

    @property
    def undo_sentence(self) -> str:
        return self.undo[0].upper() + self.undo[1:]


ENV_SETTING = Setting()


class _State:
    """This process's segment (one per process)."""

    def __init__(self) -> None:
        self.library: ctypes.CDLL | None = None
        self.registered = False
        self.world = 0  # processes that share the segment: those of this host
        self.rank = -1  # this process's rank among them (its local rank)
        self.process_id = -1  # its id in the job
        # Every host's processes; more than one host: the hierarchical all-reduce
        # (hier_collectives), whose shared-memory steps run among this host's processes.
        self.hosts = host_groups.Hosts(())
        self.hierarchical_traced = 0  # hierarchical all-reduces traced into programs (tests)
        self.name = ""  # the segment's name in /dev/shm (unlinked once every process mapped it)
        self.traced_calls = 0  # how many all-reduces were traced into programs (tests read it)
        self.scatters_traced = 0  # the same for reduce-scatters (fit's sharded update)

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def hierarchical(self) -> bool:
        """Whether the job spans several hosts (shm inside each, gloo between them)."""
        return self.active and len(self.hosts.members) > 1

    def process_of(self, rank: int) -> int:
        """The job's process id of this host's local ``rank`` (as the C++ errors name it)."""
        members = self.hosts.members[self.hosts.host_of(self.process_id)] if self.active else ()
        return members[rank] if 0 <= rank < len(members) else rank


state = _State()


def slot_bytes() -> int:
    """Option ``shm_slot_bytes`` (``STRATAX_SHM_SLOT_BYTES``, default 1 MiB): larger buffers
    go through in chunks.

    Raises:
        ValueError: not an integer >= 64.
    """
    value = config.shm_slot_bytes
    return value - value % 64


def spin_seconds(own_cores: bool = False) -> float:
    """Option ``shm_spin_us`` (``STRATAX_SHM_SPIN_US``): microseconds a wait spins before it
    sleeps. Default: 1 s when
    every process has a core of its own (:func:`own_cores`), else 50 us.

    Raises:
        ValueError: not a number >= 0.
    """
    default = OWN_CORES_SPIN_US if own_cores else SHARED_CORES_SPIN_US
    microseconds = config.get("shm_spin_us", default=default)
    return microseconds * 1e-6


def _cpus() -> set[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return os.sched_getaffinity(0)
    return set(range(os.cpu_count() or 1))


def own_cores(affinities: Sequence[set[int]]) -> bool:
    """Whether processes with these CPU affinities can each run on a core of its own: no more
    processes than CPUs among them (e.g. pinned to distinct cores, or unpinned on a host with
    at least as many cores)."""
    return len(affinities) <= len(set().union(*affinities))


def _load() -> ctypes.CDLL:
    if state.library is None:
        library = ctypes.CDLL(str(shm_build.library_path()))
        for name in ("stratax_shm_create", "stratax_shm_attach"):
            getattr(library, name).restype = ctypes.c_int
        library.stratax_shm_create.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint64,
                                               ctypes.c_double, ctypes.c_double,
                                               ctypes.c_char_p, ctypes.c_int]
        library.stratax_shm_attach.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                               ctypes.c_uint64, ctypes.c_double, ctypes.c_double,
                                               ctypes.c_char_p, ctypes.c_int]
        library.stratax_shm_unlink.argtypes = [ctypes.c_char_p]
        state.library = library
    if not state.registered:
        for target in (TARGET, EXCHANGE_TARGET):
            jax.ffi.register_ffi_target(
                target, jax.ffi.pycapsule(state.library.StrataxShmCollective), platform="cpu")
        state.registered = True
    return state.library


def _host_identity() -> str:
    """Host name, boot id and network namespace: processes that share all three share memory.

    The namespace tells apart two "hosts" on one machine (containers, the two-host test bed of
    ``benchmarks/cluster/netns.py``), whose processes reach each other only over the network.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        network = os.readlink("/proc/self/ns/net")
    except OSError:
        network = "?"
    return f"{socket.gethostname()}/{boot}/{network}"


def _local_problem() -> str:
    """Why this process cannot join a shared-memory all-reduce, or ``""``."""
    if not sys.platform.startswith("linux"):
        return f"it runs on {sys.platform}; shm needs Linux (POSIX shared memory, futexes)"
    devices = jax.local_devices()
    if len(devices) != 1 or devices[0].platform != "cpu":
        return (f"it has {len(devices)} local {devices[0].platform} device(s); shm needs "
                "exactly one local CPU device per process")
    return ""


def setup(process_id: int, num_processes: int, timeout_seconds: float,
          task_name: Any = str, *, required: bool = True, chosen: Setting = ENV_SETTING) -> bool:
    """Joins (a host's first process: creates) its host's shared segment; False for gloo.

    Every process reaches the same verdict. On one host the segment carries the all-reduce
    between all processes; on several hosts with the same number (>= 2) of processes each, the
    hierarchical all-reduce (:mod:`hier_collectives`) uses each host's segment and gloo between
    the hosts. With ``required`` (``shm`` asked for, by the setting ``chosen``, which the errors
    name) a layout neither fits (one process per host, unequal hosts), a process with several
    devices, a library that could not be built or cached on some process, or a segment that
    cannot be created, is an error on all of them. Without it (``auto``) they mean gloo
    everywhere: logged once at INFO, except a failed build (no compiler, an unwritable cache),
    which the user can fix: one warning line.

    Raises:
        ValueError: ``required`` and the layout fits no shared-memory all-reduce or a process
            has not exactly one CPU device.
        ExtensionBuildError: ``required`` and a process could not build the library.
        CollectiveTimeoutError: a process did not answer within ``timeout_seconds``.
        RuntimeError: a segment could not be created or mapped.
    """
    client = seam.distributed_client()
    timeout_ms = max(int(timeout_seconds * 1000), 1)
    client.key_value_set(f"{_KEY}/host/{process_id}", _host_identity())
    identities = [_get(client, f"{_KEY}/host/{p}", timeout_ms, task_name(p))
                  for p in range(num_processes)]
    hosts = host_groups.group(identities)
    layout = host_groups.hierarchy_problem(hosts) if len(hosts.members) > 1 else ""
    verdict = _local_problem()
    build_error = ""
    if not verdict and not layout:
        try:
            _load()
        except shm_build.ExtensionBuildError as error:
            build_error = str(error)
    client.key_value_set(f"{_KEY}/verdict/{process_id}",
                         f"error:{verdict}" if verdict else f"nobuild:{build_error}"
                         if build_error else "ok")
    client.key_value_set(f"{_KEY}/cpus/{process_id}", ",".join(map(str, sorted(_cpus()))))
    verdicts = {p: _get(client, f"{_KEY}/verdict/{p}", timeout_ms, task_name(p))
                for p in range(num_processes)}
    # The processes of this machine (its boot id), whichever host (namespace) they are in:
    # they share its cores, so a long spin would take a core from another host's process.
    machine = identities[process_id].split("/")[1]
    affinities = [{int(c) for c in _get(client, f"{_KEY}/cpus/{p}", timeout_ms,
                                         task_name(p)).split(",")}
                  for p in range(num_processes) if identities[p].split("/")[1] == machine]
    failure, gloo_reason = _outcome(layout, verdicts, required, chosen, task_name)
    # Process 0 hosts the coordination service: it acts on the verdicts (and may raise and
    # exit) only once every other process has read them. The others need the service no more
    # on an error, so they act at once. (A barrier here lost a race: process 0 could leave it
    # and exit before a peer's own barrier call had returned, which then failed.) For the same
    # reason a peer's acknowledgement may fail after it arrived: process 0 read it and exited
    # before the reply came back. The verdicts are read by then, so the peer acts on them.
    # A peer with an error writes it before acknowledging: once process 0 exits, the end of
    # its service may abort the peer before its traceback is printed.
    if failure is not None and process_id != 0:
        logger.error("%s", failure)
        sys.stderr.flush()
    try:
        client.key_value_set(f"{_KEY}/read/{process_id}", "1")
    except Exception:  # XlaRuntimeError: the service is gone
        if process_id == 0 or (failure is None and gloo_reason is None):
            raise
    if process_id == 0:
        for p in range(1, num_processes):
            _get(client, f"{_KEY}/read/{p}", timeout_ms, task_name(p))
    if failure is not None:
        raise failure
    if gloo_reason is not None:
        return _use_gloo(gloo_reason) if gloo_reason else False
    problem = _join_segment(client, process_id, hosts, timeout_seconds, timeout_ms,
                            task_name, spin_seconds(own_cores(affinities)), chosen)
    if problem:
        if required:
            raise RuntimeError(f"{problem}. {chosen.undo_sentence} (gloo).")
        return _use_gloo(problem)
    if state.hierarchical:
        logger.info("CPU collectives: hierarchical all-reduce for packed all-reduces: shared "
                    "memory inside each of %d hosts (%d processes each), gloo between the "
                    "processes of equal local rank on different hosts (%s: %d processes on %d "
                    "hosts; STRATAX_CPU_COLLECTIVES=gloo turns it off)", len(hosts.members),
                    state.world, "shm" if required else "auto", num_processes,
                    len(hosts.members))
    elif not required:
        logger.info("CPU collectives: gloo plus the shared-memory all-reduce for packed "
                    "all-reduces (auto: all %d processes on one host, one CPU device each; "
                    "STRATAX_CPU_COLLECTIVES=gloo turns it off)", num_processes)
    return True


def _use_gloo(reason: str) -> bool:
    logger.info("CPU collectives: gloo (auto: no shared-memory all-reduce because %s; "
                "STRATAX_CPU_COLLECTIVES=gloo silences this)", reason)
    return False


def _outcome(layout: str, verdicts: dict[int, str], required: bool, chosen: Setting,
             task_name: Any) -> tuple[Exception | None, str | None]:
    """What every process does with the verdicts: ``(error to raise, None)`` where ``shm`` was
    required and cannot be had; ``(None, why)`` to fall back to gloo (``""``: already said, as
    a warning); ``(None, None)`` to go on with the shared segment."""
    problem = layout or next((f"{task_name(p)} {text[6:]}" for p, text in verdicts.items()
                              if text.startswith("error:")), "")
    if problem:
        if required:
            return ValueError(f"{chosen.asked} cannot be used: {problem}. "
                              f"{chosen.undo_sentence} (gloo) for this job."), None
        return None, problem
    for p, text in verdicts.items():
        if text.startswith("nobuild:"):
            if required:
                return shm_build.ExtensionBuildError(
                    f"{chosen.asked} cannot be used: {task_name(p)} could not build the "
                    f"shared-memory all-reduce: {text[8:]}\nFix that, or {chosen.undo} to fall "
                    "back to gloo."), None
            # A warning, in one line: the user expected the faster transport and can fix this.
            logger.warning("CPU collectives: gloo (auto: %s could not build the shared-memory "
                           "all-reduce: %s; STRATAX_CPU_COLLECTIVES=shm shows the whole error, "
                           "=gloo silences this)", task_name(p), text[8:].splitlines()[0])
            return None, ""
    return None, None


def _get(client: Any, key: str, timeout_ms: int, peer: str) -> str:
    try:
        return client.blocking_key_value_get(key, timeout_ms)
    except Exception as error:  # XlaRuntimeError: DEADLINE_EXCEEDED or the service is gone
        raise CollectiveTimeoutError(
            f"{peer} did not publish {key!r} for the shared-memory all-reduce within "
            f"{timeout_ms / 1000:g} s ({error}). Check {peer}'s log.") from error


def _join_segment(client: Any, process_id: int, hosts: host_groups.Hosts,
                  timeout_seconds: float, timeout_ms: int, task_name: Any, spin: float,
                  chosen: Setting) -> str:
    """Maps its host's segment on every process; ``""``, or (on every process) why a host's
    first process could not create its segment (a failed mapping names ``chosen``'s undo)."""
    library = _load()
    slot = slot_bytes()
    error = ctypes.create_string_buffer(512)
    host = hosts.host_of(process_id)
    members = hosts.members[host]
    rank, world = members.index(process_id), len(members)
    if rank == 0:
        name = f"/stratax-{os.getpid()}-{secrets.token_hex(6)}".encode()
        created = library.stratax_shm_create(name, world, slot, timeout_seconds, spin, error,
                                             512) == 0
        client.key_value_set(f"{_KEY}/name/{host}", name.decode() if created else
                             f"failed:{task_name(process_id)} could not create the "
                             f"shared-memory segment: {error.value.decode()}")
        if created:
            try:
                deadline = time.monotonic() + timeout_seconds
                while library.stratax_shm_attached() < world:
                    if time.monotonic() > deadline:
                        raise CollectiveTimeoutError(
                            f"Only {library.stratax_shm_attached()} of {world} processes mapped "
                            f"the shared-memory segment within {timeout_seconds:g} s; check the "
                            "other workers' logs.")
                    time.sleep(0.001)
            finally:
                library.stratax_shm_unlink(name)
    else:
        published = _get(client, f"{_KEY}/name/{host}", timeout_ms, task_name(members[0]))
        if not published.startswith("failed:"):
            name = published.encode()
            if library.stratax_shm_attach(name, rank, world, slot, timeout_seconds, spin,
                                          error, 512) != 0:
                raise RuntimeError(f"Mapping the shared-memory segment failed: "
                                   f"{error.value.decode()}. {chosen.undo_sentence} (gloo).")
    # Every host's outcome, so that all processes agree (a failed host means gloo everywhere).
    for h, first in enumerate(m[0] for m in hosts.members):
        outcome = _get(client, f"{_KEY}/name/{h}", timeout_ms, task_name(first))
        if outcome.startswith("failed:"):
            if h != host:  # this host's segment is mapped: unmap it
                library.stratax_shm_close()
            return outcome[7:]
    state.world, state.rank, state.name = world, rank, name.decode()
    state.process_id, state.hosts = process_id, hosts
    atexit.register(close)
    logger.info("shared-memory all-reduce: process %d of %d on this host, slots of %d bytes, "
                "waits spin up to %g us", rank, world, slot, spin * 1e6)
    return ""


def close() -> None:
    """Unmaps this process's segment (called at exit)."""
    if state.library is not None and state.active:
        state.library.stratax_shm_close()
    state.world, state.rank = 0, -1
