"""One chief session per cluster in a process, shared by that process's strategies.

Why: TensorFlow lets a program build a second ``ParameterServerStrategy`` (and its
``ClusterCoordinator``) on the cluster it already uses; both live side by side on the same
servers, each with its own variables and functions. A chief session (``tasks.ownership``)
refuses a second chief while the first one is live, which is right for a second *process*;
a second strategy in the same process is the same chief, so the strategies of one process
share one session per cluster:

- the first strategy claims the tasks (resetting them after a quiet previous chief) and the
  session's own clients heartbeat them until the last strategy leaves;
- a later strategy joins the live session: no claim, no reset (the first one's variables
  stay), and a *namespace* (``"s1/"``, ``"s2/"``, ...; ``""`` for the first) that prefixes
  the keys of its variables on the ps and the names of its programs and iterators on the
  workers, so neither strategy reads or runs what the other created (step ids need no
  prefix: the ps count them per shard);
- ``leave`` returns True for the last strategy, which then asks the tasks to exit.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence

from stratax._src.parameter_server.tasks.ownership import ChiefSession
from stratax._src.parameter_server.transport import rpc

Listener = Callable[[rpc.RpcClient], None]


@dataclasses.dataclass(frozen=True)
class Membership:
    """A strategy's place in a shared session: the session and the strategy's namespace."""

    session: ChiefSession
    namespace: str
    key: tuple[tuple[str, ...], tuple[str, ...]]
    listener: Listener


@dataclasses.dataclass
class _Entry:
    session: ChiefSession
    clients: list[rpc.RpcClient]  # the session's own: they outlive any one strategy's
    listeners: list[Listener]  # one per member strategy
    joined: int = 0  # strategies that ever joined: the next one's namespace number


def _notify(listeners: list[Listener], client: rpc.RpcClient) -> None:
    for listener in list(listeners):
        listener(client)


class SharedSessions:
    """The chief sessions of this process, one per cluster (``ps`` and ``worker`` addresses)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[tuple[str, ...], tuple[str, ...]], _Entry] = {}

    def join(self, ps: Sequence[str], workers: Sequence[str], timeout: float,
             clients: Sequence[rpc.RpcClient], on_restart: Listener) -> Membership:
        """Puts a strategy whose ``clients`` call the tasks at these addresses in the cluster's
        session: the live one, or a new one that claims every task and starts heartbeating.

        Args:
          timeout: The strategy's ``timeout_seconds`` (a new session's, see ``ChiefSession``).
          clients: The strategy's clients; their calls carry the session from now.
          on_restart: Called with a client of a task the heartbeat saw restarted (the
            session's client: match it to the strategy's by ``name``).

        Raises:
          SessionError: another chief owns the tasks (see ``ChiefSession.claim``).
        """
        key = (tuple(ps), tuple(workers))
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                own = [*(rpc.RpcClient(f"ps {i}", a, timeout) for i, a in enumerate(ps)),
                       *(rpc.RpcClient(f"worker {i}", a, timeout) for i, a in enumerate(workers))]
                listeners: list[Listener] = []
                session = ChiefSession(own, timeout, functools.partial(_notify, listeners))
                try:
                    session.claim()
                except BaseException:
                    for client in own:
                        client.close()
                    raise
                session.start()
                entry = self._entries[key] = _Entry(session, own, listeners)
            entry.listeners.append(on_restart)
            entry.session.attach(clients)
            namespace = f"s{entry.joined}/" if entry.joined else ""
            entry.joined += 1
            return Membership(entry.session, namespace, key, on_restart)

    def leave(self, membership: Membership) -> bool:
        """Takes a strategy out of its session; True when it was the last one (the session has
        stopped heartbeating: the caller may ask the tasks to exit)."""
        with self._lock:
            entry = self._entries.get(membership.key)
            if entry is None or entry.session is not membership.session:
                return False
            entry.listeners.remove(membership.listener)
            if entry.listeners:
                return False
            del self._entries[membership.key]
        entry.session.stop()
        for client in entry.clients:
            client.close()
        return True


sessions = SharedSessions()
