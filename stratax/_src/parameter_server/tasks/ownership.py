"""Which chief owns a served task, and how long a task waits for a chief before it exits.

Why: TensorFlow's servers never exit on their own, so a chief killed with ``kill -9`` (or one
that failed at start-up) leaves every ps and worker running and holding its port, and a second
chief started on the same tasks trains on the first one's variables with colliding step ids
(its steps are skipped as duplicates). Here each chief (each ``ParameterServerStrategy`` on a
``chief`` task) has a *session* id:

- at start-up it *claims* every task with a ``session`` call; a task owned by another session
  heard from within ``LIVE_SECONDS`` refuses (two chiefs at once: the second fails with an
  error naming the first); a task whose owner went quiet is taken over and *reset* (a ps drops
  its variables, a worker its programs, iterators and arrays), so the new chief starts from
  its own initial values (or its checkpoint) and no step id of the old session is kept;
- every call of the chief, and every ps call a worker makes for one of its closures, carries
  the session; a claimed task refuses calls of another session (a replaced chief's late
  calls), and every task refuses calls with no session (``ChiefWatch.check``, which every call
  but the chief's ``hello``, ``session`` and a bare ``ping`` passes through);
- the session id is the chief's capability: no reply, error or log names it (a refusal says
  which host and pid hold the task), and a session that was replaced is retired for good, so
  its heartbeats (a late chief's, or a replay) keep nothing alive;
- the chief repeats the claim every ``HEARTBEAT_SECONDS`` (the *heartbeat*): it tells each task
  the chief is alive and the coordinator which tasks answer (a stopped worker's closure moves
  on) and which were restarted (each process has its own ``incarnation``);
- a task that hears no heartbeat for its chief timeout (``Server(chief_timeout_seconds=...)``,
  ``STRATAX_PS_CHIEF_TIMEOUT_SECONDS``, default 120 s, counted from its start) exits with status
  1, releasing its port; the launcher's or Kubernetes' restart policy then decides.

A task no chief has claimed yet (a restarted ps that the workers reach before the chief's next
heartbeat claims it) serves calls of any session; calls without one it refuses all the same.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.core.errors import StrataxError
from stratax._src.parameter_server.transport import rpc, wire

logger = logging.getLogger(__name__)

DEFAULT_CHIEF_TIMEOUT_SECONDS = config.option("ps_chief_timeout_seconds").default
MIN_CHIEF_TIMEOUT_SECONDS = config.option("ps_chief_timeout_seconds").kind.minimum
HEARTBEAT_SECONDS = 0.5
# A chief not heard from for this long may be replaced by another chief's claim.
LIVE_SECONDS = 5.0
_OWNED = "is owned by another chief"  # in a refusal: the claim may succeed later
_MAX_SESSION_CHARS = 256
_RETIRED_KEPT = 64  # digests of replaced sessions a task remembers
_SESSION_SHAPE = re.compile(r"(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{32}")


class SessionError(StrataxError):
    """A task refused a call: it carries no session, or another chief's session owns the task."""


def describe(session: str | None) -> str:
    """Who holds ``session``, for errors and logs, without the id itself (the id is the
    chief's capability: whoever knows it can act as that chief)."""
    match = _SESSION_SHAPE.fullmatch(session or "")
    if match is None:
        return "another chief"
    return f"the chief on host {match['host']}, pid {match['pid']}"


def _digest(session: str) -> bytes:
    return hashlib.sha256(session.encode("utf-8", "surrogatepass")).digest()


def session_digest(session: str) -> str:
    """The SHA-256 of ``session`` (hex): what a task may keep on disk (a ps snapshot) to
    recognise the session later, without storing the capability itself (a random 128-bit id,
    so the digest does not reveal it)."""
    return _digest(session).hex()


def _session_of(meta: dict[str, Any]) -> str | None:
    """The call's ``session`` field if it is a usable one (a non-empty string of bounded
    length), else None."""
    session = meta.get("session")
    if isinstance(session, str) and 0 < len(session) <= _MAX_SESSION_CHARS:
        return session
    return None


def resolve_chief_timeout(seconds: float | None = None) -> float:
    """How long a served task waits for a chief: ``seconds`` if given, else
    ``$STRATAX_PS_CHIEF_TIMEOUT_SECONDS``, else 120.

    Raises:
      ValueError: a value below 3 s or not a number, naming it.
    """
    if seconds is None:
        return config.ps_chief_timeout_seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
            seconds >= MIN_CHIEF_TIMEOUT_SECONDS):
        raise ValueError(
            f"chief_timeout_seconds must be a number >= {MIN_CHIEF_TIMEOUT_SECONDS:g}, got "
            f"{seconds!r}; e.g. Server(..., chief_timeout_seconds=120).")
    return float(seconds)


class ChiefWatch:
    """The served task's side: its owner session, when the owner was last heard, and whether
    the task has waited longer than ``timeout`` for a chief (``lost`` is then set).

    Args:
      name: The task, e.g. ``"ps 0"``, for logs and errors.
      timeout: Seconds without a heartbeat after which the task gives up (from its start).
      reset: Drops the task's state; called when a new session takes over from a quiet one.
      adopt: Called with each accepted claim's meta (the chief's ``timeout_s``).
    """

    def __init__(self, name: str, timeout: float, reset: Callable[[], None],
                 adopt: Callable[[dict[str, Any]], None] = lambda meta: None) -> None:
        self.name, self.timeout = name, timeout
        self.incarnation = uuid.uuid4().hex
        self.lost = threading.Event()
        self._reset, self._adopt = reset, adopt
        self._owner: str | None = None
        self._retired: list[bytes] = []  # digests of replaced sessions, newest last
        self._heard = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True,
                                        name=f"stratax-chief-watch-{name}")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                quiet = time.monotonic() - self._heard
            if quiet > self.timeout:
                logger.error("%s: no chief heard for %.0f s (chief timeout %g s, %s); exiting",
                             self.name, quiet, self.timeout, env.STRATAX_PS_CHIEF_TIMEOUT_SECONDS)
                self.lost.set()
                return

    def claim(self, frame: wire.Frame) -> bytes:
        """Answers a chief's ``session`` call: accepted (and the owner refreshed) when the
        session owns the task, when the task has no owner, or when the owner is quiet (then the
        task's state is reset and the old session retired); refused while another owner is
        live, and always for a retired session (a replaced chief's heartbeats, or a replay of
        them, keep nothing alive)."""
        session = _session_of(frame.meta)
        if session is None:
            raise wire.WireError(
                f"A session call needs a 'session' string of 1 to {_MAX_SESSION_CHARS} "
                "characters.")
        digest = _digest(session)
        with self._lock:
            quiet = time.monotonic() - self._heard
            owner = self._owner
            if any(hmac.compare_digest(digest, old) for old in self._retired):
                raise SessionError(
                    f"{self.name} was taken over by another chief session; this chief was "
                    "replaced: stop it.")
            if owner is not None and not hmac.compare_digest(digest, _digest(owner)):
                if quiet < LIVE_SECONDS:
                    raise SessionError(
                        f"{self.name} {_OWNED} ({describe(owner)}, heard {quiet:.1f} s ago); "
                        "stop that chief first: two chiefs on one cluster would train over "
                        "each other.")
                logger.warning("%s: %s takes over from %s (quiet for %.1f s); dropping that "
                               "session's state", self.name, describe(session), describe(owner),
                               quiet)
                self._retired = [*self._retired[-_RETIRED_KEPT + 1:], _digest(owner)]
                self._reset()
            took_over = owner not in (None, session)
            self._owner, self._heard = session, time.monotonic()
        self._adopt(frame.meta)
        return rpc.response({"incarnation": self.incarnation, "chief_timeout_s": self.timeout,
                             "took_over": took_over})

    def check(self, meta: dict[str, Any]) -> None:
        """Refuses a call that carries no session, or a session that does not own this task:
        the one check every call that reads or changes the task's state or lifecycle passes
        (``Server`` calls it before its service sees the frame). A task no chief has claimed
        yet serves any session (a restarted ps that the workers reach before the chief's next
        heartbeat claims it)."""
        session = _session_of(meta)
        method = meta.get("method")
        if session is None:
            raise SessionError(
                f"{self.name} refused {method!r}: the call carries no chief session; only the "
                "calls of the chief that claimed this task (a ParameterServerStrategy, and its "
                "workers' calls for its closures) may read or change it.")
        with self._lock:
            owner = self._owner
        if owner is not None and not hmac.compare_digest(_digest(session), _digest(owner)):
            raise SessionError(
                f"{self.name} refused {method!r}: it belongs to another chief session; this "
                "chief was replaced by another one (or the task restarted): stop this chief.")


class ChiefSession:
    """The chief's side: claims every task, then heartbeats them until ``stop()``.

    Args:
      clients: One ``RpcClient`` per ps and worker task; their calls carry the session from now.
      timeout: The chief's ``timeout_seconds``: the workers use it for their ps calls, and a
        claim refused because another chief is live is retried this long.
      on_restart: Called with a client whose task answers with a new incarnation (restarted).
    """

    def __init__(self, clients: Sequence[rpc.RpcClient], timeout: float,
                 on_restart: Callable[[rpc.RpcClient], None] = lambda client: None) -> None:
        # Host and pid for people (``describe``), then 128 random bits: the capability.
        self.id = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(16)}"
        self._clients = list(clients)
        self._timeout = timeout
        self._on_restart = on_restart
        self.incarnations: dict[str, str] = {}
        self.answered: dict[str, float] = {}  # client name -> monotonic time of its last answer
        self._refused_logged = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.attach(self._clients)

    def attach(self, clients: Sequence[rpc.RpcClient]) -> None:
        """Makes the calls of more clients (another strategy's, see ``shared_session``) carry
        this session."""
        for client in clients:
            client.session = self.id

    def _meta(self) -> dict[str, Any]:
        return {"session": self.id, "timeout_s": self._timeout}

    def claim(self) -> None:
        """Claims every task, waiting (up to the timeout) for a quiet previous chief's tasks.

        Raises:
          SessionError: another chief is still live after the timeout; the message names it.
        """
        deadline = time.monotonic() + self._timeout
        for client in self._clients:
            while True:
                try:
                    reply = client.call("session", self._meta(), timeout=self._timeout)
                    break
                except rpc.RemoteError as err:
                    if _OWNED not in str(err) or time.monotonic() > deadline:
                        raise SessionError(f"{err} (this chief waited {self._timeout:g} s, its "
                                           "timeout_seconds)") from None
                    time.sleep(HEARTBEAT_SECONDS)
            self.incarnations[client.name] = reply.meta["incarnation"]
            self.answered[client.name] = time.monotonic()

    def start(self) -> None:
        """Starts one heartbeat thread per task."""
        for client in self._clients:
            thread = threading.Thread(target=self._beat, args=(client,), daemon=True,
                                      name=f"stratax-heartbeat-{client.name}")
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _beat(self, client: rpc.RpcClient) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                reply = client.call("session", self._meta(), timeout=2 * HEARTBEAT_SECONDS)
            except rpc.RemoteError as err:  # another chief took the task over: say so once
                if not self._refused_logged:
                    self._refused_logged = True
                    logger.error("heartbeat refused: %s", err)
                continue
            except StrataxError:
                continue  # not answering: the coordinator reads ``answered``
            self.answered[client.name] = time.monotonic()
            incarnation = reply.meta.get("incarnation")
            if self.incarnations.get(client.name) != incarnation:
                self.incarnations[client.name] = incarnation
                logger.warning("%s at %s was restarted (new process)", client.name,
                               client.address)
                self._on_restart(client)

    def refresh(self, client: rpc.RpcClient, timeout: float) -> None:
        """Claims ``client``'s task now and records its incarnation (the coordinator taking a
        worker back has rebuilt its state: the heartbeat must not report that restart again).

        Raises:
          StrataxError: the task does not answer or refuses.
        """
        reply = client.call("session", self._meta(), timeout=timeout)
        self.incarnations[client.name] = reply.meta["incarnation"]
        self.answered[client.name] = time.monotonic()

    def quiet_seconds(self, client: rpc.RpcClient) -> float:
        """Seconds since ``client``'s task last answered a heartbeat."""
        return time.monotonic() - self.answered.get(client.name, time.monotonic())
