"""One node of an elastic launch across hosts (``--nnodes MIN:MAX --rdzv-endpoint HOST:PORT``):
the agent that joins each round of the rendezvous, runs this node's workers for it, and
restarts them when the membership changes.

Each round (``rounds``) gives this node its rank, the number of nodes and the round's
``jax.distributed`` coordinator, so its workers get the usual environment (world size = nodes x
``--nproc-per-node``, ``STRATAX_RESTART_COUNT`` = the round). While they run, the agent calls
the store every heartbeat interval; when the store says the round is over (a node was lost, a
node arrives, a node's workers failed) it stops its workers and joins the next round, from
which ``sx.BackupAndRestore`` resumes the last backup whatever the new world size. Its own
workers' failure ends the round for every node (counted against ``--max-restarts``); their
success is reported, and the job ends when every node of the round reported it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import socket
import time
from typing import Any

from stratax._src.core import env as env_names
from stratax._src.launch.child_env import build_worker_specs
from stratax._src.launch.config import LaunchError, parse_address
from stratax._src.launch.launcher import Launcher
from stratax._src.launch.network import reserve_free_ports
from stratax._src.launch.outcome import LaunchResult, TaskFailure, failure_of
from stratax._src.launch.rendezvous import (
    RendezvousClient,
    RendezvousStore,
    call_until,
    can_bind,
)
from stratax._src.launch.rounds import Rounds
from stratax._src.launch.worker_group import WorkerGroup
from stratax._src.parameter_server.transport.rpc import read_token

_LINGER_SECONDS = 10.0  # the store waits this long at most for the agents to learn the end


class NodeAgent(Launcher):
    """``launch()`` of one node of an elastic job across hosts."""

    def _run(self, started: float) -> LaunchResult:
        config = self._config
        endpoint = parse_address(config.rdzv_endpoint or "", "--rdzv-endpoint")
        token = read_token()
        if not token:
            raise ValueError(
                f"--rdzv-endpoint {endpoint}: the rendezvous store listens on the network and "
                f"takes only launchers holding the cluster token; set "
                f"{env_names.STRATAX_PS_TOKEN}=<secret> (or {env_names.STRATAX_PS_TOKEN_FILE}="
                "<path>) to the same secret on every node.")
        store: RendezvousStore | None = None
        client: RendezvousStore | RendezvousClient
        if can_bind(endpoint):
            rounds = Rounds(config.min_nnodes or config.nnodes, config.nnodes,
                            last_call=config.rdzv_last_call,
                            heartbeat_timeout=config.rdzv_heartbeat_timeout,
                            max_restarts=config.max_restarts,
                            log=lambda line: self._notice(f"rendezvous: {line}."))
            client = store = RendezvousStore(rounds, endpoint, token)
            self._notice(f"this node hosts the rendezvous store at {endpoint}.")
        else:
            client = RendezvousClient(endpoint, token)
        self._node = secrets.token_hex(8)
        try:
            return self._rounds(client, started)
        finally:
            if store is not None:
                if store.rounds.outcome is not None:
                    self._linger(store)
                store.close()
            else:
                client.close()

    def _rounds(self, client: RendezvousStore | RendezvousClient,
                started: float) -> LaunchResult:
        config = self._config
        deadline = None if config.timeout is None else started + config.timeout
        interval = min(1.0, config.rdzv_heartbeat_timeout / 5)
        failures: list[TaskFailure] = []
        finished_round = -1  # a round whose workers all ended well here
        joined_at = time.monotonic()
        reply = self._ask(client, self._join(), config.coordinator_wait)
        while True:
            if reply is None or self._stop.is_set():
                return self._leave(client, self._result(started, 0, failures, interrupted=True))
            if deadline is not None and time.monotonic() >= deadline:
                self._notice(f"timeout of {config.timeout:g} s reached.")
                return self._leave(client, self._result(started, reply.get("round", 0),
                                                        failures, timed_out=True))
            state = reply["state"]
            if state in ("finished", "stopped"):
                return self._leave(client, self._end(reply, started, failures))
            if state == "join":
                joined_at = time.monotonic()
                reply = self._ask(client, self._join(), config.coordinator_wait)
                continue
            if state == "running" and reply["round"] != finished_round:
                ran = reply["round"]
                reply, finished = self._run_round(client, reply, deadline, interval, failures)
                finished_round = ran if finished else finished_round
                continue
            if state == "forming" and time.monotonic() - joined_at > config.coordinator_wait:
                raise LaunchError(
                    f"Round {reply['round']} of the rendezvous at {config.rdzv_endpoint} has "
                    f"{reply['joined']} node(s), fewer than the minimum "
                    f"{config.min_nnodes or config.nnodes}, after {config.coordinator_wait:g} s;"
                    " start the launchers of the other nodes, or wait longer with "
                    "--coordinator-wait SECONDS.")
            self._stop.wait(interval)
            reply = self._sync(client)

    def _run_round(self, client: RendezvousStore | RendezvousClient, reply: dict[str, Any],
                   deadline: float | None, interval: float,
                   failures: list[TaskFailure]) -> tuple[dict[str, Any] | None, bool]:
        """Runs this node's workers for the round in ``reply``; returns the store's next reply,
        and whether the workers all ended well."""
        round_, nnodes = reply["round"], reply["nnodes"]
        coordinator = parse_address(reply["coordinator"], "the round's coordinator")
        config = dataclasses.replace(
            self._config, nnodes=nnodes, node_rank=reply["rank"], coordinator=str(coordinator),
            min_nnodes=None, rdzv_endpoint=None)
        self._membership(reply, config.num_processes)
        ports = None
        if nnodes == 1:  # one node: its TF_CONFIG lists every worker's port
            ports = [coordinator.port, *(p for p in reserve_free_ports(config.nproc_per_node)
                                         if p != coordinator.port)][:config.nproc_per_node]
        specs = build_worker_specs(config, coordinator, round_, self._base_env, ports)
        self._group = group = WorkerGroup.start(
            self._cmd, specs, stdout=self._stdout, stderr=self._stderr, log_dir=config.log_dir,
            restart_count=round_, capture_output=self._capture, cwd=self._cwd)
        if self._events is not None:
            self._events.append("start", restart=round_, pids=[w.pid for w in group.workers],
                                tasks=[w.spec.file_name for w in group.workers],
                                ranks=[w.spec.global_rank for w in group.workers])
        exited: set[int] = set()
        next_sync = time.monotonic() + interval
        while True:
            worker = group.next_exit(interval / 2)
            if worker is not None and worker.returncode == 0:
                exited.add(worker.pid)
            if self._stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                group.teardown(config.grace_period, self._force)
                return reply, False  # the main loop ends the launch
            if worker is not None and worker.returncode != 0:
                group.teardown(config.grace_period, self._force)
                cause = group.root_cause() or worker
                failures.append(failure_of(cause, round_))
                self._record_failure(failures[-1])
                self._notice(f"{failures[-1].describe()}; round {round_} ends for every node.")
                return self._ask(client, {"op": "fail", "node": self._node, "round": round_,
                                          "message": failures[-1].describe()},
                                 config.rdzv_heartbeat_timeout), False
            if len(exited) == len(group.workers):
                group.teardown(config.grace_period, self._force)
                return self._ask(client, {"op": "done", "node": self._node, "round": round_},
                                 config.rdzv_heartbeat_timeout), True
            if time.monotonic() >= next_sync:
                next_sync = time.monotonic() + interval
                reply = self._sync(client)
                if reply is None or reply.get("round") != round_ or reply["state"] != "running":
                    self._notice(f"round {round_} is over; stopping this node's "
                                 f"{len(group.workers)} worker(s) to join the next.")
                    group.teardown(config.grace_period, self._force)
                    return reply, False

    def _membership(self, reply: dict[str, Any], world: int) -> None:
        """Says who trains in this round, and why it began (the run's journal has it too)."""
        nodes = ", ".join(reply["nodes"])
        text = (f"round {reply['round']}: {reply['nnodes']} node(s) [{nodes}], {world} "
                f"worker(s) in all; this node is rank {reply['rank']}, the coordinator "
                f"{reply['coordinator']}")
        if reply["round"]:
            text += f" (the round began because {reply['why']})"
            if self._events is not None:
                self._events.append("restart", restart=reply["round"], workers=world,
                                    message=text)
        self._notice(text + ".")

    def _end(self, reply: dict[str, Any], started: float,
             failures: list[TaskFailure]) -> LaunchResult:
        group, self._group = self._group, None
        ok = reply["state"] == "finished"
        own = failures[-1] if failures else None
        exit_code = 0 if ok else (own.returncode if own and own.returncode > 0 else 1)
        rounds = len({f.restart_count for f in failures})
        summary = (f"stratax launch: the job {reply['state']}: {reply['reason']}"
                   + (f"; this node's workers failed in {rounds} round(s)." if rounds else "."))
        outputs = None
        if self._capture:
            workers = group.workers if group is not None else []
            outputs = {w.spec.global_rank: w.output.captured() or [] for w in workers}
        return LaunchResult(
            exit_code=exit_code, restarts=int(reply.get("round", 0)), failures=tuple(failures),
            timed_out=False, interrupted_by=None, elapsed=time.monotonic() - started,
            summary=summary, outputs=outputs,
            workers=len(group.workers) if group is not None else 0)

    def _join(self) -> dict[str, Any]:
        """A join message, with a fresh port for the round's coordinator should this node be
        rank 0."""
        return {"op": "join", "node": self._node, "port": reserve_free_ports(1, "")[0],
                "name": f"{socket.gethostname()} pid {os.getpid()}"}

    def _sync(self, client: RendezvousStore | RendezvousClient) -> dict[str, Any] | None:
        return self._ask(client, {"op": "sync", "node": self._node},
                         self._config.rdzv_heartbeat_timeout)

    def _ask(self, client: RendezvousStore | RendezvousClient, message: dict[str, Any],
             wait: float) -> dict[str, Any] | None:
        """The store's reply (``None``: a signal stopped the launcher meanwhile)."""
        if isinstance(client, RendezvousStore):
            return client.call(message)
        try:
            return call_until(client, message, wait, self._stop)
        except LaunchError:
            if self._group is not None:
                self._group.teardown(self._config.grace_period, self._force)
            raise

    def _leave(self, client: RendezvousStore | RendezvousClient,
               result: LaunchResult) -> LaunchResult:
        if self._group is not None:
            self._group.teardown(self._config.grace_period, self._force)
        with contextlib.suppress(ConnectionError, LaunchError):  # a gone store drops it anyway
            client.call({"op": "leave", "node": self._node})
        return result

    def _linger(self, store: RendezvousStore) -> None:
        """Keeps the store up until the other agents learnt the job's end (they leave), for
        at most ``_LINGER_SECONDS``; a node that never asks is dropped by then anyway."""
        until = time.monotonic() + min(_LINGER_SECONDS, self._config.rdzv_heartbeat_timeout)
        while store.rounds.known and time.monotonic() < until and not self._force.is_set():
            time.sleep(0.1)
