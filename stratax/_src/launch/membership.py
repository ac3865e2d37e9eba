"""Which of a node's worker slots take part in the next start of the group, and when a failure
ends the launch.

Without elasticity the group lives and dies together: any failure restarts it, up to
``max_restarts`` times in all. An elastic launch (``--nproc-per-node MIN:MAX``) starts MAX
workers, one per *slot*, and counts failures per slot: a slot may fail ``max_restarts`` times
(the group restarts each time, as usual), and its next failure drops it; the group then
restarts with the slots left, as long as MIN remain. Each start numbers its workers 0..n-1 over
the slots it has, so the program sees an ordinary group of n workers, and
``sx.BackupAndRestore`` resumes the last backup whatever number of workers wrote it (the global
batch, the data order and the random streams do not depend on it).

Membership changes only when the group restarts (torchrun's rendezvous rule), so a dropped slot
is tried again at a later restart, and the group grows back, up to MAX. It sits out the start
that follows its drop and rejoins at the restart after it; having used its restarts, it is
dropped again at its next failure, and then sits out twice as many starts as the time before
(1, 2, 4, ...). A slot that never recovers thus costs the group one restart for each doubling
of the restarts that other failures cause (about log2 of them), never one restart per restart.

A start that fails because the global batch does not split over its replicas (stratax's "Global
batch size B does not split over N replicas" error) is the group's failure, not a slot's: no
slot is charged, and from then on every start has the largest number of slots, at least MIN,
whose replicas divide the batch (the others wait, and join when a start can take them); when
no such number is left, the launch stops with that error.
"""

from __future__ import annotations

import collections
import dataclasses
import re

# stratax's own error (data/global_batch.py: check_divisible), as a worker prints it.
_BATCH_SPLIT = re.compile(r"Global batch size (\d+) does not split over (\d+) replicas")


def batch_split_error(lines: tuple[str, ...] | list[str]) -> tuple[int, int] | None:
    """``(global batch, replicas)`` when ``lines`` (a worker's traceback) end in the error of a
    global batch that does not split over the replicas, else ``None``."""
    for line in reversed(lines):
        found = _BATCH_SPLIT.search(line)
        if found:
            return int(found[1]), int(found[2])
    return None


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
      >>> members.after_failure(local_rank=0, restarts=1)  # slot 1 is back, slot 0 dropped
      'drop'
      >>> members.slots, members.rejoined
      ([1], [1])
    """

    maximum: int
    minimum: int | None
    max_restarts: int
    slots: list[int] = dataclasses.field(init=False)
    dropped: list[int] = dataclasses.field(default_factory=list, init=False)
    # Slots that came back at the last restart.
    rejoined: list[int] = dataclasses.field(default_factory=list, init=False)
    # Slots left out of the next start only because the batch does not split over them.
    waiting: list[int] = dataclasses.field(default_factory=list, init=False)
    # (global batch, replicas per worker) once a start failed on the batch split.
    batch: tuple[int, int] | None = dataclasses.field(default=None, init=False)
    last_failed: int | None = dataclasses.field(default=None, init=False)
    _failures: collections.Counter[int] = dataclasses.field(
        default_factory=collections.Counter, init=False)
    _drops: collections.Counter[int] = dataclasses.field(
        default_factory=collections.Counter, init=False)
    _sit_out: dict[int, int] = dataclasses.field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.slots = list(range(self.maximum))

    @property
    def size(self) -> int:
        """Workers of the next start."""
        return len(self.slots)

    @property
    def came_back(self) -> list[int]:
        """Slots of the next start that were dropped before."""
        return [slot for slot in self.slots if self._drops[slot]]

    def failures(self, slot: int) -> int:
        return self._failures[slot]

    def after_failure(self, local_rank: int, restarts: int) -> str:
        """Records the failure of the current start's worker ``local_rank`` (the root cause)
        after ``restarts`` restarts in all; returns what the group does next: ``restart``,
        ``drop`` (that slot is dropped, the rest restart) or ``stop``. Dropped slots whose turn
        has come rejoin (``rejoined``)."""
        if self.minimum is None:
            return "restart" if restarts < self.max_restarts else "stop"
        slot = self.last_failed = self.slots[local_rank]
        self._failures[slot] += 1
        candidates = self._returning()
        step = "restart"
        if self._failures[slot] > self.max_restarts:
            candidates.remove(slot)
            self.dropped.append(slot)
            self._drops[slot] += 1
            self._sit_out[slot] = 2 ** (self._drops[slot] - 1)
            step = "drop"
        return self._regroup(candidates, step)

    def after_batch_split(self, batch: int, replicas: int) -> str:
        """Records that the current start failed because ``batch`` does not split over its
        ``replicas``; returns ``restart`` with the largest number of slots that splits it, or
        ``stop`` where none (or the launch is not elastic)."""
        if self.minimum is None or replicas % self.size:
            return "stop"
        self.batch = (batch, replicas // self.size)
        return self._regroup(self._returning(), "restart")

    def _returning(self) -> list[int]:
        """The slots of the current start, and the waiting and dropped slots whose turn has
        come (a restart boundary passes for every dropped slot)."""
        back = []
        for slot in list(self.dropped):
            self._sit_out[slot] -= 1
            if self._sit_out[slot] <= 0:
                self.dropped.remove(slot)
                back.append(slot)
        self.rejoined = back
        return sorted(self.slots + self.waiting + back)

    def _regroup(self, candidates: list[int], step: str) -> str:
        """Takes the next start's slots from ``candidates``: all of them, or the most (lowest
        slots first) whose replicas split the batch; ``stop`` below the minimum."""
        count = len(candidates)
        if self.batch is not None:
            batch, per_worker = self.batch
            count = next((n for n in range(count, 0, -1) if batch % (n * per_worker) == 0), 0)
        if count < (self.minimum or 1):
            return "stop"
        self.slots, self.waiting = candidates[:count], candidates[count:]
        self.rejoined = [s for s in self.rejoined if s in self.slots]
        return step
