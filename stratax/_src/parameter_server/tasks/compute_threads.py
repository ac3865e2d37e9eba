"""How many threads a worker task's XLA computations may use: the host's cores shared out
among the worker tasks the cluster places on that host.

XLA's CPU client gives every process an intra-op thread pool with one thread per core. When
several worker tasks share a host (``stratax launch --workers 2 --ps 1`` on one machine), each
worker's pool competes with the others' for the same cores, and a step split over threads that
are not really free costs more CPU than the same step on one thread (figures in
docs/design/performance.md, "Numbers behind the code's choices"). A worker therefore sizes its
pool to ``cores // co-located workers`` (at least 1), before JAX creates its CPU client. One
worker per host keeps XLA's default.

``STRATAX_PS_WORKER_THREADS``: ``auto`` (default, the rule above), ``all`` (XLA's default) or
a positive number of threads. An ``NPROC`` already in the environment (the variable XLA's CPU
client reads for its pool size) is left alone.
"""

from __future__ import annotations

import logging
import os

from stratax._src.cluster.cluster_spec import ClusterSpec, parse_address
from stratax._src.core import env
from stratax._src.core.addresses import is_loopback
from stratax._src.core.config import config

logger = logging.getLogger(__name__)

_XLA_POOL_SIZE = "NPROC"  # read by XLA's CPU client when it is created


def host_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def colocated_workers(spec: ClusterSpec, task_index: int) -> int:
    """Worker tasks of ``spec`` on the host of worker ``task_index`` (itself included):
    the same host name, or loopback addresses both."""
    addresses = spec.job_tasks("worker")
    mine, _ = parse_address(addresses[task_index], f"worker[{task_index}]")
    count = 0
    for index, address in enumerate(addresses):
        host, _ = parse_address(address, f"worker[{index}]")
        count += host == mine or (is_loopback(host) and is_loopback(mine))
    return count


def worker_threads(spec: ClusterSpec, task_index: int, cores: int | None = None) -> int | None:
    """Threads worker ``task_index``'s XLA pool gets under option ``ps_worker_threads``
    (``STRATAX_PS_WORKER_THREADS``), or None for XLA's default (one per core)."""
    setting = config.ps_worker_threads
    if setting == "all":
        return None
    if setting != "auto":
        return setting
    cores = host_cores() if cores is None else cores
    workers = colocated_workers(spec, task_index)
    return max(1, cores // workers) if workers > 1 else None


def limit_worker_threads(spec: ClusterSpec, task_index: int) -> int | None:
    """Sets the XLA pool size of this worker process (see the module docstring); returns it,
    or None where XLA's default stays. Takes effect only if JAX has not yet created its CPU
    client in this process (a worker task that starts with the program, as usual)."""
    if _XLA_POOL_SIZE in os.environ:
        return None
    threads = worker_threads(spec, task_index)
    if threads is None:
        return None
    os.environ[_XLA_POOL_SIZE] = str(threads)
    logger.info("worker %d: %d XLA thread(s) (%d cores, %d worker tasks on this host; "
                "%s=all keeps one per core)", task_index, threads, host_cores(),
                colocated_workers(spec, task_index), env.STRATAX_PS_WORKER_THREADS)
    return threads
