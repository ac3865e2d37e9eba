"""Validated settings of one ``stratax launch`` run, and the launcher's own error type.

Every check happens here, before a process starts, so a bad flag gives one clear message
instead of a half-started cluster.
"""

from __future__ import annotations

import dataclasses
import math
import os


class LaunchError(RuntimeError):
    """The launcher could not start the group: port taken, coordinator unreachable, ...

    Raised before any worker runs (or before a restart); failures of the workers themselves are
    reported in :class:`~stratax._src.launch.outcome.LaunchResult`, not raised.
    """


@dataclasses.dataclass(frozen=True)
class Address:
    """A ``host:port`` pair; IPv6 hosts are written in brackets (``[::1]:1234``)."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_address(text: str, what: str = "--coordinator") -> Address:
    """Parses ``host:port`` (or ``[v6host]:port``) into an :class:`Address`.

    Raises:
        ValueError: naming ``what`` and the received text when it is not ``host:port`` with a
            port in 1..65535.
    """
    host, sep, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit():
        raise ValueError(
            f"{what} must be 'host:port' (e.g. '10.0.0.1:29500'), got {text!r}."
        )
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{what} port must be in 1..65535, got {port} in {text!r}.")
    return Address(host, port)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Shape and policies of a launched process group; validated on construction.

    Global rank of a worker = ``node_rank * nproc_per_node + local_rank``; the process with
    global rank 0 hosts the ``jax.distributed`` coordinator at ``coordinator``.

    Example:
        >>> LaunchConfig(nproc_per_node=2).num_processes
        2
    """

    nproc_per_node: int = 1
    min_nproc_per_node: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    coordinator: str | None = None
    max_restarts: int = 0
    timeout: float | None = None
    grace_period: float = 5.0
    coordinator_wait: float = 120.0
    log_dir: str | None = None
    # Elastic across hosts (``--nnodes MIN:MAX`` with ``--rdzv-endpoint``): see ``rounds``.
    min_nnodes: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_last_call: float = 3.0
    rdzv_heartbeat_timeout: float = 15.0

    def __post_init__(self) -> None:
        _check_int("nproc_per_node", self.nproc_per_node, minimum=1,
                   fix="start at least one process per node, e.g. --nproc-per-node 2")
        _check_int("nnodes", self.nnodes, minimum=1, fix="use --nnodes 1 for a single machine")
        if self.min_nproc_per_node is not None:
            _check_int("min_nproc_per_node", self.min_nproc_per_node, minimum=1,
                       fix="keep at least one worker, e.g. --nproc-per-node 1:2")
            if self.min_nproc_per_node > self.nproc_per_node:
                raise ValueError(
                    f"--nproc-per-node {self.min_nproc_per_node}:{self.nproc_per_node}: the "
                    "minimum is above the maximum; write MIN:MAX, e.g. 1:2.")
            if self.nnodes > 1 or self.rdzv_endpoint is not None:
                raise ValueError(
                    f"--nproc-per-node {self.min_nproc_per_node}:{self.nproc_per_node} with "
                    f"--nnodes {self.nnodes}: a group shrinks worker by worker on one node "
                    "only; across hosts, give a fixed --nproc-per-node and make the nodes "
                    "elastic instead (--nnodes MIN:MAX --rdzv-endpoint HOST:PORT).")
        self._check_rendezvous()
        _check_int("node_rank", self.node_rank, minimum=0, fix="number nodes from 0")
        if self.node_rank >= self.nnodes:
            raise ValueError(
                f"node_rank {self.node_rank} is out of range for nnodes={self.nnodes}; "
                f"use --node-rank 0..{self.nnodes - 1}."
            )
        _check_int("max_restarts", self.max_restarts, minimum=0,
                   fix="use --max-restarts 0 to never restart")
        if self.coordinator is not None:
            parse_address(self.coordinator)
        elif self.nnodes > 1 and self.rdzv_endpoint is None:
            raise ValueError(
                f"nnodes={self.nnodes} needs --coordinator host:port, the address of node 0 "
                f"that every node can reach (e.g. --coordinator 10.0.0.1:29500)."
            )
        if self.timeout is not None:
            _check_seconds("timeout", self.timeout, allow_zero=False)
        _check_seconds("grace_period", self.grace_period, allow_zero=True)
        _check_seconds("coordinator_wait", self.coordinator_wait, allow_zero=True)
        if self.log_dir is not None and os.path.exists(self.log_dir) and not os.path.isdir(
            self.log_dir
        ):
            raise ValueError(
                f"log_dir {self.log_dir!r} exists and is not a directory; pass a directory path."
            )

    def _check_rendezvous(self) -> None:
        nodes = f"{self.min_nnodes}:{self.nnodes}" if self.min_nnodes is not None \
            else str(self.nnodes)
        if self.min_nnodes is not None:
            _check_int("min_nnodes", self.min_nnodes, minimum=1,
                       fix="keep at least one node, e.g. --nnodes 1:2")
            if self.min_nnodes > self.nnodes:
                raise ValueError(f"--nnodes {nodes}: the minimum is above the maximum; write "
                                 "MIN:MAX, e.g. --nnodes 1:2.")
            if self.rdzv_endpoint is None:
                raise ValueError(
                    f"--nnodes {nodes} needs --rdzv-endpoint HOST:PORT, an address of one of "
                    "the nodes that all of them reach (its launcher hosts the rendezvous "
                    "store), e.g. --rdzv-endpoint 10.0.0.1:29400, on every node.")
        if self.rdzv_endpoint is None:
            return
        parse_address(self.rdzv_endpoint, "--rdzv-endpoint")
        if self.coordinator is not None:
            raise ValueError(
                f"--coordinator {self.coordinator} with --rdzv-endpoint: each round of the "
                "rendezvous picks its own coordinator (rank 0's host, a fresh port); drop "
                "--coordinator.")
        if self.node_rank != 0:
            raise ValueError(
                f"--node-rank {self.node_rank} with --rdzv-endpoint: the rendezvous assigns "
                "node ranks at each round; drop --node-rank.")
        _check_seconds("rdzv_last_call", self.rdzv_last_call, allow_zero=True)
        _check_seconds("rdzv_heartbeat_timeout", self.rdzv_heartbeat_timeout,
                       allow_zero=False)

    @property
    def num_processes(self) -> int:
        """Processes in the whole job, over all nodes."""
        return self.nnodes * self.nproc_per_node

    @property
    def coordinator_address(self) -> Address | None:
        """The parsed ``coordinator``, or ``None`` when the launcher picks a free port."""
        return None if self.coordinator is None else parse_address(self.coordinator)

    def global_rank(self, local_rank: int) -> int:
        """Global rank (``STRATAX_PROCESS_ID``) of this node's worker ``local_rank``."""
        return self.node_rank * self.nproc_per_node + local_rank


def parse_nproc(text: str | int, flag: str = "--nproc-per-node") -> tuple[int | None, int]:
    """``(minimum, maximum)`` from ``--nproc-per-node`` or ``--nnodes``: ``N`` (minimum
    ``None``: not elastic) or torchrun's elastic ``MIN:MAX``.

    Example:
        >>> parse_nproc("1:2")
        (1, 2)
    """
    parts = str(text).split(":")
    if len(parts) > 2 or not all(part.isdigit() for part in parts):
        raise ValueError(f"{flag} must be N or MIN:MAX (e.g. 2 or 1:2), got {text!r}.")
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 else (None, int(parts[0]))


def _check_int(name: str, value: object, *, minimum: int, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}).")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}; {fix}.")


def _check_seconds(name: str, value: object, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}.")
    if math.isnan(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value}.")
