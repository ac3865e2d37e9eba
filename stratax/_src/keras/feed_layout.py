"""``FeedLayout``: which rows of each global batch this process feeds (``keras.feed``'s share rule).

Worker ``p`` of ``P`` feeds rows ``[p*B/P, (p+1)*B/P)`` of each global batch of ``B`` rows;
a batch that does not split over the replicas is fed whole to every replica.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class FeedLayout:
    """How global batches are shared: replicas, this process among the processes, replication."""

    num_replicas: int
    process_rank: int = 0
    num_processes: int = 1
    replicate_all: bool = False
    # Processes whose devices hold one replica (model parallelism across processes): they
    # feed the same rows, so the batch splits into ``num_processes // processes_per_replica``.
    processes_per_replica: int = 1

    @property
    def num_shares(self) -> int:
        """How many distinct shares a global batch splits into (one per group of processes
        that feed the same replicas)."""
        return self.num_processes // self.processes_per_replica

    @property
    def share_index(self) -> int:
        """Which of the :attr:`num_shares` shares this process feeds."""
        return self.process_rank // self.processes_per_replica

    def share(self, rows: int) -> slice | None:
        """The rows of a global batch of ``rows`` this process feeds; ``None``: all of them,
        replicated on every replica (the batch does not split, or ``replicate_all``)."""
        if self.replicate_all or rows % self.num_replicas:
            return None
        size = rows // self.num_shares
        return slice(self.share_index * size, (self.share_index + 1) * size)

    def local(self, batch: Any) -> tuple[Any, bool]:
        """This process's share of a global ``batch``, and whether it is replicated."""
        rows = self.share(batch_rows(batch))
        if rows is None:
            return batch, True
        if self.num_shares == 1:
            return batch, False
        return jax.tree.map(lambda a: np.asarray(a)[rows], batch), False


def batch_rows(tree: Any) -> int:
    """The number of rows of a batch (its first leaf's leading dimension)."""
    return int(jax.tree.leaves(tree)[0].shape[0])

