"""``ProcessLayout``: where a process stands in a synchronous multi-process group.

Kept apart from ``sync_group`` (which derives it from a resolver) so that resolvers can state a
layout outright without importing the module that consumes them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProcessLayout:
    """This process' place in a synchronous multi-process group.

    Attributes:
      coordinator_address: ``"host:port"`` of the process that hosts the ``jax.distributed``
        coordination service (process 0), or ``None`` in local mode.
      num_processes: Number of processes in the group (1 in local mode).
      process_id: This process' id in ``[0, num_processes)``.
      task_type: This process' job name (``"chief"``/``"worker"``), or ``None`` in local mode.
      task_id: This process' index within its job, or ``None`` in local mode.

    Example:
      >>> ProcessLayout("host0:2222", num_processes=3, process_id=1, task_type="worker",
      ...               task_id=0).is_coordinator
      False
    """

    coordinator_address: str | None
    num_processes: int
    process_id: int
    task_type: str | None
    task_id: int | None

    @property
    def is_coordinator(self) -> bool:
        """True for process 0, the one that hosts the coordination service."""
        return self.process_id == 0

    @property
    def is_local(self) -> bool:
        """True when there is no cluster: one process, no coordinator."""
        return self.coordinator_address is None
