"""A bound on how many compiled steps the host dispatches ahead of the devices.

XLA's in-process CPU collectives deadlock when the host queues many multi-device steps ahead
(``rendezvous.cc: Termination timeout for all reduce ... Expected 2 threads to join``;
reproduced by ``tests/runtime/test_cpu_collective_hazard.py``). The aborting thread's stack
shows why: the all-reduce thunk of one device runs as a continuation *on a worker of the Eigen
intra-op thread pool* (after a parallel matmul finished) and blocks there in the rendezvous,
waiting for the other device's participant. That pool is shared by all CPU devices and has one
thread per core; with many steps in flight, every pool thread can end up blocked in a rendezvous
while the other device's compute, which it needs to arrive, waits in the same pool's queue.
A small window of steps in flight never deadlocked where unbounded dispatch did (the
measurement: docs/design/performance.md, "Numbers behind the code's choices"). Strategies
whose replicas are several CPU devices of one process therefore wait for step ``k - window``
before dispatching step ``k``. Accelerators and single-device strategies are not bounded.
"""

from __future__ import annotations

import collections
from typing import Any

import jax

from stratax._src.core.config import config

DEFAULT_CPU_WINDOW = config.option("max_steps_in_flight").default


def cpu_window() -> int:
    """Option ``max_steps_in_flight`` (``STRATAX_MAX_STEPS_IN_FLIGHT``; 0 = unbounded), else
    ``DEFAULT_CPU_WINDOW``."""
    return config.max_steps_in_flight


def needs_bound(devices: list[jax.Device]) -> bool:
    """True when several of ``devices`` are CPU devices of this process (the hazardous case)."""
    local_cpu = [d for d in devices
                 if d.platform == "cpu" and d.process_index == jax.process_index()]
    return len(local_cpu) > 1


class DispatchWindow:
    """Keeps at most ``size`` dispatched steps unfinished; ``size`` 0 means no bound.

    With ``release`` > 1, a full window waits for its ``release`` oldest steps at once (steps
    finish in order, so waiting for the newest of them is enough): one wait per ``release``
    steps instead of one per step. Each wait puts the host thread to sleep and wakes it, which
    costs a core shared with the step (docs/design/performance.md has the figure).
    """

    def __init__(self, size: int, release: int = 1) -> None:
        if not 1 <= release <= max(size, 1):
            raise ValueError(f"release must be in [1, size={size}]; received {release}.")
        self.size = size
        self.release = release
        self._in_flight: collections.deque[Any] = collections.deque()

    def admit(self, outputs: Any) -> None:
        """Records a dispatched step's outputs, then waits for the oldest steps beyond the
        window."""
        if self.size <= 0:
            return
        leaves = [x for x in jax.tree.leaves(outputs) if hasattr(x, "block_until_ready")]
        if not leaves:
            return
        self._in_flight.append(leaves[0])
        while len(self._in_flight) > self.size:
            for _ in range(self.release - 1):
                self._in_flight.popleft()
            self._in_flight.popleft().block_until_ready()

    def drain(self) -> None:
        """Waits for every recorded step."""
        while self._in_flight:
            self._in_flight.popleft().block_until_ready()

    def forget(self) -> None:
        """Drops the recorded steps without waiting (after a failure that already surfaced)."""
        self._in_flight.clear()


# Steps a process of a multi-process job may run ahead of its last finished one, and how
# many a wait releases. A step whose collective failed (a peer died) fails every later step at
# once without running; the host learns of it only when it waits on a result, so the bound
# also says how soon a dead peer reaches Python as an error (within 16 steps), instead of at
# the end of the epoch or never.
MULTI_PROCESS_WINDOW = 16
MULTI_PROCESS_RELEASE = 8


def window_for(devices: list[jax.Device], num_processes: int) -> DispatchWindow:
    """The bound on steps in flight for a strategy over ``devices``."""
    if needs_bound(devices):
        return DispatchWindow(cpu_window())
    if num_processes > 1:
        return DispatchWindow(MULTI_PROCESS_WINDOW, MULTI_PROCESS_RELEASE)
    return DispatchWindow(0)
