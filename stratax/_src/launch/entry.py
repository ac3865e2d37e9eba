"""``launch()``: the launcher's programmatic entry point (``stratax launch`` calls it too).

It checks the settings (``LaunchConfig``) and runs them: a group of workers on this node
(``launcher.Launcher``), or, with ``rdzv_endpoint``, this node's agent of an elastic job across
hosts (``node_agent.NodeAgent``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from stratax._src.core import env as env_names
from stratax._src.launch.config import LaunchConfig
from stratax._src.launch.launcher import Launcher
from stratax._src.launch.outcome import LaunchResult
from stratax._src.observe.events import EventLog


def launch(
    cmd: Sequence[str],
    nproc_per_node: int = 1,
    *,
    min_nproc_per_node: int | None = None,
    nnodes: int = 1,
    min_nnodes: int | None = None,
    node_rank: int = 0,
    coordinator: str | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_last_call: float = 3.0,
    rdzv_heartbeat_timeout: float = 15.0,
    max_restarts: int = 0,
    timeout: float | None = None,
    grace_period: float = 5.0,
    coordinator_wait: float = 120.0,
    log_dir: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    capture_output: bool = False,
    stream_output: bool = True,
    handle_signals: bool = False,
    run_dir: str | None = None,
) -> LaunchResult:
    """Runs ``cmd`` as ``nproc_per_node`` workers of this node and waits for the group to end.

    Args:
        cmd: the full command of every worker, e.g. ``[sys.executable, "train.py", "--lr=1"]``.
        nproc_per_node: workers started on this node.
        min_nproc_per_node: makes the launch elastic (torchrun's ``--nproc-per-node MIN:MAX``):
            a worker slot that fails more than ``max_restarts`` times is dropped and the group
            restarts with the slots left, down to this many, and takes it back at a later
            restart (see ``membership``); ``None``: not elastic.
        nnodes: nodes in the job; with more than one, run one launcher per node.
        min_nnodes: makes the nodes elastic (torchrun's ``--nnodes MIN:MAX``, with
            ``rdzv_endpoint``): a round of the rendezvous forms with ``min_nnodes`` to
            ``nnodes`` nodes, and a lost or arriving node starts a new round (``node_agent``).
        node_rank: this node's index in ``0..nnodes-1``; node 0 hosts the coordinator.
        coordinator: ``host:port`` of the coordinator. Default on one node: ``127.0.0.1`` and a
            free port; required when ``nnodes > 1`` without ``rdzv_endpoint``.
        rdzv_endpoint: ``host:port`` of the rendezvous store, on one of the nodes (whose
            launcher hosts it): node ranks and the coordinator come from its rounds
            (``rounds``). Needs the cluster token (``STRATAX_PS_TOKEN``) on every node.
        rdzv_last_call: seconds a round with at least ``min_nnodes`` nodes waits for more.
        rdzv_heartbeat_timeout: seconds after which a silent node is dropped.
        max_restarts: restarts of the whole group after a worker failure before giving up
            (elastic: the failures each slot may have before it is dropped).
        timeout: wall-clock seconds for the whole launch, restarts included; ``None`` = no limit.
        grace_period: seconds between SIGTERM and SIGKILL when stopping workers.
        coordinator_wait: seconds a node with ``node_rank > 0`` retries reaching the coordinator
            (with ``rdzv_endpoint``: the store, and the wait for a round of MIN nodes).
        log_dir: when set, each worker's output is appended to ``log_dir/worker_<rank>.log``.
        env: variables added to the inherited environment of every worker.
        cwd: working directory of the workers (default: the launcher's).
        capture_output: keep every output line in ``LaunchResult.outputs`` (rank -> lines).
        stream_output: relay prefixed output to ``sys.stdout`` / ``sys.stderr``.
        handle_signals: install SIGINT/SIGTERM handlers (main thread only) that stop the group
            and end the launch with ``exit_code = 128 + signum``. ``stratax launch`` sets it.
        run_dir: observed run: workers get ``STRATAX_RUN_DIR`` (where ``sx.observe`` and
            ``sx.callbacks.WorkerMetrics`` write) and the launcher appends its starts, failures,
            restarts and end to ``run_dir/events.jsonl`` (see ``stratax._src.observe.events``).

    Returns:
        A :class:`LaunchResult`; worker failures do not raise.

    Raises:
        ValueError, TypeError: a bad argument (named in the message), ``cmd[0]`` not found, or
            ``rdzv_endpoint`` without the cluster token.
        LaunchError: the coordinator port is taken on node 0, or a node with ``node_rank > 0``
            cannot reach the coordinator within ``coordinator_wait`` seconds; with
            ``rdzv_endpoint``: the store cannot be reached (at the start within
            ``coordinator_wait``, later within ``rdzv_heartbeat_timeout``), or no round of
            ``min_nnodes`` nodes formed within ``coordinator_wait``.
    """
    if isinstance(cmd, str) or not cmd or not all(isinstance(part, str) for part in cmd):
        raise TypeError(
            f"cmd must be a non-empty list of strings such as [sys.executable, 'train.py'], "
            f"got {cmd!r}."
        )
    config = LaunchConfig(
        nproc_per_node=nproc_per_node, min_nproc_per_node=min_nproc_per_node,
        nnodes=nnodes, node_rank=node_rank,
        coordinator=coordinator, max_restarts=max_restarts, timeout=timeout,
        grace_period=grace_period, coordinator_wait=coordinator_wait, log_dir=log_dir,
        min_nnodes=min_nnodes, rdzv_endpoint=rdzv_endpoint, rdzv_last_call=rdzv_last_call,
        rdzv_heartbeat_timeout=rdzv_heartbeat_timeout,
    )
    base_env = dict(os.environ)
    base_env.update(env or {})
    if run_dir is not None:
        base_env[env_names.STRATAX_RUN_DIR] = os.path.abspath(run_dir)
    kind = Launcher
    if rdzv_endpoint is not None:
        # Imported here: it brings gRPC (~0.2 s), which a launch on one node does not need.
        from stratax._src.launch.node_agent import NodeAgent

        kind = NodeAgent
    runner = kind(
        list(cmd), config, base_env, cwd=cwd, capture_output=capture_output,
        stdout=sys.stdout if stream_output else None,
        stderr=sys.stderr if stream_output else None,
        events=EventLog(run_dir) if run_dir is not None else None,
    )
    return runner.run(handle_signals)
