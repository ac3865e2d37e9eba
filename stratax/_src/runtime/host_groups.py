"""Which processes of a job share a host, and whether a hierarchical all-reduce fits them.

Shared memory links only the processes of one host; between hosts the bytes go through gloo.
:func:`group` turns every process's host identity (host name, boot id, network namespace) into
the job's hosts; :func:`hierarchy_problem` says why a hierarchical all-reduce (shared memory
inside each host, gloo between the processes of equal local rank on different hosts) cannot
run over them. Pure functions of the identities, so every process reaches the same answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Hosts:
    """The processes of each host, hosts in the order of their lowest process id.

    Args:
        members: ``members[h]`` lists host ``h``'s process ids in increasing order; the position
            of a process in its host's list is its local rank.
    """

    members: tuple[tuple[int, ...], ...]

    def host_of(self, process: int) -> int:
        """The index of ``process``'s host."""
        return next(h for h, ids in enumerate(self.members) if process in ids)

    def local_rank(self, process: int) -> int:
        """``process``'s position among the processes of its host."""
        return self.members[self.host_of(process)].index(process)

    def peer(self, process: int, host: int) -> int:
        """The process of ``host`` with ``process``'s local rank."""
        return self.members[host][self.local_rank(process)]


def group(identities: Sequence[str]) -> Hosts:
    """Groups process ids (positions in ``identities``) by equal host identity."""
    order: dict[str, list[int]] = {}
    for process, identity in enumerate(identities):
        order.setdefault(identity, []).append(process)
    return Hosts(tuple(tuple(ids) for ids in order.values()))


def hierarchy_problem(hosts: Hosts) -> str:
    """Why ``hosts`` (several) cannot run the hierarchical all-reduce, or ``""``."""
    sizes = sorted({len(ids) for ids in hosts.members})
    if len(sizes) > 1:
        return (f"the processes span {len(hosts.members)} hosts with unequal numbers of "
                f"processes ({', '.join(str(len(ids)) for ids in hosts.members)}); a "
                "hierarchical all-reduce needs the same number on every host")
    if sizes == [1]:
        return (f"the processes span {len(hosts.members)} hosts with one process each (nothing "
                "to share memory with)")
    return ""
