"""Which of a node's worker slots take part in the next start of the group, and when a failure
ends the launch.

Without elasticity the group lives and dies together: any failure restarts it, up to
``max_restarts`` times in all. An elastic launch (``--nproc-per-node MIN:MAX``) starts MAX
workers, one per *slot*, and counts failures per slot: a slot may fail ``max_restarts`` times
(the group restarts each time, as usual), and its next failure drops it for good; the group
then restarts with the slots left, as long as MIN remain. Each start numbers its workers
0..n-1 over the slots it has, so the program sees an ordinary group of n workers, and
``sx.BackupAndRestore`` resumes the last backup whatever number of workers wrote it (the global
batch, the data order and the random streams do not depend on it).
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class Membership:
    """The slots of this node's group and their failures.

    Args:
      maximum: Slots, the workers of the first start (``--nproc-per-node``'s MAX).
      minimum: Fewest slots the group may shrink to; ``None``: not elastic.
      max_restarts: Restarts of the group in all (not elastic) or per slot (elastic).

    Example:
      >>> members = Membership(maximum=2, minimum=1, max_restarts=0)
      >>> members.after_failure(local_rank=1, restarts=0)
      'drop'
      >>> members.slots, members.dropped
      ([0], [1])
    """

    maximum: int
    minimum: int | None
    max_restarts: int
    slots: list[int] = dataclasses.field(init=False)
    dropped: list[int] = dataclasses.field(default_factory=list, init=False)
    _failures: collections.Counter[int] = dataclasses.field(
        default_factory=collections.Counter, init=False)

    def __post_init__(self) -> None:
        self.slots = list(range(self.maximum))

    @property
    def size(self) -> int:
        """Workers of the next start."""
        return len(self.slots)

    def failures(self, slot: int) -> int:
        return self._failures[slot]

    def after_failure(self, local_rank: int, restarts: int) -> str:
        """Records the failure of the current start's worker ``local_rank`` (the root cause)
        after ``restarts`` restarts in all; returns what the group does next: ``restart`` (the
        same slots), ``drop`` (that slot is dropped, the rest restart) or ``stop``."""
        if self.minimum is None:
            return "restart" if restarts < self.max_restarts else "stop"
        slot = self.slots[local_rank]
        self._failures[slot] += 1
        if self._failures[slot] <= self.max_restarts:
            return "restart"
        if self.size - 1 < self.minimum:
            return "stop"
        self.slots.remove(slot)
        self.dropped.append(slot)
        return "drop"
