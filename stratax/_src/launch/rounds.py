"""The rounds of an elastic launch across hosts (``--nnodes MIN:MAX``): which nodes train together,
their ranks, and when the membership changes. Pure state, no network (``rendezvous`` serves it).

The rules are those of torchrun's dynamic rendezvous (c10d backend), kept small:

- A round *forms* as agents join. It closes at once when MAX nodes joined, or once MIN joined,
  ``last_call`` seconds passed without another joining (each join restarts that wait), and
  every node the store knows alive joined: the nodes of the round that just ended are still
  stopping their workers, and a round closed without them would end again as they arrive.
  Closing assigns the node ranks (the store's own node first, then the nodes of the last round
  in their old order, then the others by arrival), the world size, and the ``jax.distributed``
  coordinator of the round: rank 0's address and the port it offered when it joined (a fresh
  one each round).
- A node that joins while a round runs *waits*. Below MAX the running round ends at once to
  admit it (the job grows at this boundary; torchrun's agents restart when they see a waiting
  node); at MAX it waits as a spare until the next round.
- Every agent calls the store at least each heartbeat interval. A node silent for
  ``heartbeat_timeout`` seconds is dropped; if it was in the running round, the round ends and
  the others form the next one, as long as MIN remain (else they wait for nodes to join).
- A node whose workers failed ends the round. The failed round counts against
  ``max_restarts`` when all its nodes join the next round; if one of them was lost meanwhile,
  the failure was its loss (the peers' collectives broke), a membership change, which does not
  count (torchrun counts both). Past ``max_restarts`` the job stops. When every node of the
  running round reports its workers done, the job is finished.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass
class _Node:
    node: str  # the agent's id (random, per launcher process)
    name: str  # what logs call it: "10.0.0.2 (host pid 123)"
    host: str  # the address the other nodes reach it at
    port: int  # the coordinator port it offers for its next round
    local: bool  # the agent in the store's own process
    seen: float  # its last call
    seq: int  # arrival order


class Rounds:
    """The store's state: the current round, its nodes, waiting nodes and heartbeats.

    Args:
      minimum, maximum: ``--nnodes MIN:MAX``.
      last_call: seconds a round with at least MIN nodes waits for more.
      heartbeat_timeout: seconds of silence after which a node is dropped.
      max_restarts: failed rounds allowed before the job stops.
      clock: seconds, monotonic (tests pass their own).
      log: called with each membership change, as one line.

    Example:
      >>> rounds = Rounds(1, 2, last_call=1.0, heartbeat_timeout=5.0, max_restarts=0)
      >>> rounds.join("a", "10.0.0.1", 29500, "node a")["state"]
      'forming'
    """

    def __init__(self, minimum: int, maximum: int, *, last_call: float,
                 heartbeat_timeout: float, max_restarts: int,
                 clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = lambda line: None) -> None:
        self.minimum, self.maximum = minimum, maximum
        self.last_call, self.heartbeat_timeout = last_call, heartbeat_timeout
        self.max_restarts = max_restarts
        self._clock, self._log = clock, log
        self.round = 0
        self.complete = False
        self.why = "the job starts"  # why the current round opened
        self.participants: dict[str, _Node] = {}
        self.ranks: list[str] = []  # node ids by rank, once the round closed
        self.waiting: dict[str, _Node] = {}
        self.known: dict[str, _Node] = {}
        self.done: set[str] = set()
        self.failures = 0
        self.outcome: dict[str, Any] | None = None
        self._deadline: float | None = None
        self._seq = 0
        self._order: list[str] = []  # the last closed round's ranks
        # Why the last round failed, and its nodes, until the next round closes.
        self._failed: tuple[str, set[str]] | None = None

    # --- the operations agents call ---------------------------------------------------------

    def join(self, node: str, host: str, port: int, name: str, *,
             local: bool = False) -> dict[str, Any]:
        """Registers ``node`` for the forming round, or as waiting while one runs."""
        now = self._clock()
        self._tick(now)
        if self.outcome is not None:
            return self.outcome
        self._seq += 1
        info = _Node(node, name, host, port, local, now, self._seq)
        self.known[node] = info
        if self.complete and node not in self.ranks:
            if len(self.ranks) >= self.maximum:
                self.waiting[node] = info
                self._log(f"{name} waits: round {self.round} runs with the most nodes "
                          f"({self.maximum}); it joins the next round")
                return self.state(node)
            self._open(f"{name} arrives (the job grows, to at most {self.maximum} nodes)")
        if not self.complete:
            self.participants[node] = info
            self._log(f"{name} joins round {self.round} ({len(self.participants)} of at most "
                      f"{self.maximum} nodes, at least {self.minimum})")
            if len(self.participants) >= self.maximum:
                self._close()
            elif len(self.participants) >= self.minimum:
                self._deadline = now + self.last_call
                self._tick(now)  # no last call: closes now
        return self.state(node)

    def sync(self, node: str) -> dict[str, Any]:
        """The heartbeat: notes that ``node`` is alive and returns what it should do."""
        now = self._clock()
        if node in self.known:
            self.known[node].seen = now
        self._tick(now)
        return self.state(node)

    def fail(self, node: str, round_: int, message: str) -> dict[str, Any]:
        """``node``'s workers failed in ``round_``: that round ends. Whether it was a restart
        is known when the next round closes (``_close``)."""
        self.sync(node)
        if self.outcome is None and self.complete and round_ == self.round and node in self.ranks:
            name = self.known[node].name if node in self.known else node
            self._failed = (f"the workers of {name} failed in round {round_} ({message})",
                            set(self.ranks))
            self._open(f"the workers of {name} failed ({message})")
        return self.state(node)

    def finish(self, node: str, round_: int) -> dict[str, Any]:
        """``node``'s workers all ended well in ``round_``; the job is finished once every node
        of the round says so."""
        self.sync(node)
        if self.outcome is None and self.complete and round_ == self.round and node in self.ranks:
            self.done.add(node)
            if self.done.issuperset(self.ranks):
                self.outcome = {"state": "finished", "reason": (
                    f"round {self.round}'s {len(self.ranks)} node(s) finished")}
                self._log(self.outcome["reason"])
        return self.state(node)

    def leave(self, node: str) -> dict[str, Any]:
        """``node`` goes (its launcher stops, or it learnt the outcome)."""
        state = self.state(node)
        if node in self.known:
            self._drop(node, "left")
        return state

    # --- state --------------------------------------------------------------------------------

    def state(self, node: str) -> dict[str, Any]:
        """What ``node`` should do now: ``finished``/``stopped`` (the job's end), ``waiting``,
        ``forming``, ``running`` (with its rank and the round's coordinator), or ``join`` (it is
        in no current round: join the forming one)."""
        if self.outcome is not None:
            return dict(self.outcome)
        if node in self.waiting:
            return {"state": "waiting", "round": self.round}
        if self.complete and node in self.ranks:
            first = self.known[self.ranks[0]]
            host = f"[{first.host}]" if ":" in first.host else first.host
            return {"state": "running", "round": self.round, "rank": self.ranks.index(node),
                    "nnodes": len(self.ranks), "coordinator": f"{host}:{first.port}",
                    "nodes": [self.known[n].name for n in self.ranks], "why": self.why,
                    "waiting": len(self.waiting)}
        if not self.complete and node in self.participants:
            return {"state": "forming", "round": self.round, "joined": len(self.participants)}
        return {"state": "join", "round": self.round}

    def _tick(self, now: float) -> None:
        """Drops silent nodes; closes a forming round whose last call is over."""
        for node, info in list(self.known.items()):
            if now - info.seen > self.heartbeat_timeout:
                self._drop(node, f"no heartbeat for {self.heartbeat_timeout:g} s")
        if (not self.complete and self._deadline is not None and now >= self._deadline
                and len(self.participants) >= self.minimum
                and self.known.keys() <= self.participants.keys()):
            self._close()

    def _drop(self, node: str, why: str) -> None:
        info = self.known.pop(node)
        self.waiting.pop(node, None)
        if self.outcome is not None:
            return  # the job is over: nothing changes
        if self.complete and node in self.ranks:
            self._open(f"{info.name} is lost ({why}); at least {self.minimum} node(s) go on")
        elif node in self.participants:
            del self.participants[node]
            self._log(f"{info.name} leaves the forming round {self.round} ({why})")
            if len(self.participants) < self.minimum:
                self._deadline = None
        else:
            self._log(f"{info.name} is dropped ({why})")

    def _open(self, why: str) -> None:
        """Ends the running round: every node (waiting ones too) joins the next."""
        self.round += 1
        self.complete, self.why = False, why
        self.participants, self.ranks, self.waiting, self.done = {}, [], {}, set()
        self._deadline = None
        self._log(f"round {self.round} opens: {why}")

    def _close(self) -> None:
        if self._failed is not None:
            why, nodes = self._failed
            self._failed = None
            lost = nodes - self.participants.keys()
            if lost:
                self._log(f"{why}: no restart counted, {len(lost)} of its node(s) left")
            else:
                self.failures += 1
                if self.failures > self.max_restarts:
                    self.outcome = {"state": "stopped", "reason": (
                        f"{why}; that is {self.failures} failed round(s), over "
                        f"--max-restarts {self.max_restarts}")}
                    self._log(self.outcome["reason"])
                    return
                self._log(f"{why}: restart {self.failures} of {self.max_restarts}")
        old = {node: rank for rank, node in enumerate(self._order)}
        self.ranks = sorted(self.participants, key=lambda n: (
            not self.participants[n].local, old.get(n, len(old)), self.participants[n].seq))
        self._order = list(self.ranks)
        self.complete, self._deadline = True, None
        names = ", ".join(f"{self.known[n].name} (rank {r})" for r, n in enumerate(self.ranks))
        self._log(f"round {self.round} closes with {len(self.ranks)} node(s): {names}")
