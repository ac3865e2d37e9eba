"""``TorchrunClusterResolver``: the process group of torchrun, a Kubeflow PyTorchJob or TorchX.

torchrun (TorchX's ``dist.ddp`` runs torchrun) gives each child ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; a Kubeflow PyTorchJob
gives each pod ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` (the master pod's headless Service) and
``MASTER_PORT``. ``MASTER_ADDR:MASTER_PORT`` is torch's rendezvous store, which torch itself (the
agent, or ``init_process_group`` on rank 0) listens on, so the ``jax.distributed`` coordinator
needs another port on the same host.
"""

from __future__ import annotations

import os

from stratax._src.cluster.cluster_spec import ClusterSpec, parse_address
from stratax._src.cluster.process_group_resolver import (
    ProcessGroupClusterResolver,
    check_rank,
    coordinator_address_override,
    coordinator_port_override,
    workers_at,
)
from stratax._src.core import env

_SET_BY_TORCHRUN = (
    "torchrun and a Kubeflow PyTorchJob set it for every process; start every process with the "
    "same launcher, or unset the other torchrun variables (WORLD_SIZE, RANK) for local training."
)
# Either one makes the environment a torch process group; MASTER_ADDR/MASTER_PORT alone are
# often exported by job scripts before torchrun runs, so they do not.
_GROUP_VARS = (env.WORLD_SIZE, env.RANK)
_MAX_PORT = 65535


def torchrun_coordinator_address() -> str | None:
    """The ``jax.distributed`` coordinator of a torchrun group, ``None`` if nothing names one.

    The rule, first match wins:

    1. ``JAX_COORDINATOR_ADDRESS``: stated by the user, as for ``jax.distributed``.
    2. ``MASTER_ADDR`` with ``JAX_COORDINATOR_PORT``: JAX's port override.
    3. ``MASTER_ADDR`` with ``MASTER_PORT + 1``: ``MASTER_ADDR`` is global rank 0's host, where
       the coordinator must run, but torch's store holds ``MASTER_PORT``; the next port is a
       rule every process computes alone, with no message exchanged.

    Raises:
      ValueError: A malformed address or port, or ``MASTER_PORT`` 65535 (no next port).
    """
    explicit = coordinator_address_override()
    if explicit is not None:
        return explicit
    host = os.environ.get(env.MASTER_ADDR, "").strip()
    if not host:
        return None
    port = coordinator_port_override()
    if port is None:
        master_port = env.get_int(env.MASTER_PORT, _SET_BY_TORCHRUN, minimum=1)
        if master_port >= _MAX_PORT:
            raise ValueError(
                f"{env.MASTER_PORT}={master_port} leaves no next port for the jax.distributed "
                f"coordinator (stratax uses {env.MASTER_PORT} + 1); set "
                f"{env.JAX_COORDINATOR_PORT} to a free port, or use a lower {env.MASTER_PORT}."
            )
        port = master_port + 1
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    parse_address(address, env.MASTER_ADDR)
    return address


def _one_node_cluster(
    address: str | None, world_size: int, local_size: int | None
) -> ClusterSpec | None:
    """One address per worker when the whole group runs on rank 0's node, else ``None``.

    torchrun names no process' address but the coordinator's, which is worker 0's. When every
    process is on that node (``LOCAL_WORLD_SIZE == WORLD_SIZE``), worker ``r`` is listed at the
    coordinator's host (``workers_at``) before the group forms. Across several nodes the other
    nodes' hosts are not in the environment: ``None`` keeps the coordinator alone until
    ``MultiWorkerMirroredStrategy`` has gathered every process' host.
    """
    if address is None or local_size != world_size:
        return None
    host, _ = parse_address(address, env.MASTER_ADDR)
    return workers_at(address, [host] * world_size)


class TorchrunClusterResolver(ProcessGroupClusterResolver):
    """Reads the process group that torchrun, a Kubeflow PyTorchJob or TorchX started.

    Every process is a ``"worker"`` whose task id is ``RANK``; rank 0 is the chief and hosts the
    ``jax.distributed`` coordinator at ``MASTER_ADDR:MASTER_PORT+1`` (see
    ``torchrun_coordinator_address`` for the rule and its overrides, ``JAX_COORDINATOR_ADDRESS``
    and ``JAX_COORDINATOR_PORT``). On one node the cluster spec lists every worker (see
    ``_one_node_cluster``); across nodes only worker 0, the coordinator, whose host is known.

    Example:
      >>> # torchrun --nnodes 2 --nproc-per-node 1 --master-addr node0 --master-port 29500 ...
      >>> # on node1: RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29500
      >>> resolver = TorchrunClusterResolver()
      >>> resolver.task_id, resolver.num_processes, resolver.coordinator_address
      (1, 2, 'node0:29501')
    """

    def __init__(self, rpc_layer: str | None = None) -> None:
        """Reads torchrun's variables.

        Args:
          rpc_layer: Protocol prefix of ``master()`` addresses.

        Raises:
          ValueError: ``WORLD_SIZE`` or ``RANK`` missing or malformed, a rank outside the world,
            a local rank outside its node, or several processes with no coordinator address
            (no ``MASTER_ADDR`` nor ``JAX_COORDINATOR_ADDRESS``).
        """
        world_size = env.get_int(env.WORLD_SIZE, _SET_BY_TORCHRUN, minimum=1)
        rank = env.get_int(env.RANK, _SET_BY_TORCHRUN, minimum=0)
        check_rank(env.RANK, rank, env.WORLD_SIZE, world_size)
        local_rank = env.get_optional_int(env.LOCAL_RANK, minimum=0)
        local_size = env.get_optional_int(env.LOCAL_WORLD_SIZE, minimum=1)
        if local_rank is not None and local_size is not None:
            check_rank(env.LOCAL_RANK, local_rank, env.LOCAL_WORLD_SIZE, local_size)
        if local_rank is not None and local_rank > rank:
            raise ValueError(
                f"{env.LOCAL_RANK}={local_rank} is above {env.RANK}={rank}, which no launcher "
                "produces (global ranks count every earlier node's processes too); the "
                "environment mixes two launches: start every process with the same command."
            )
        address = torchrun_coordinator_address() if world_size > 1 else None
        if world_size > 1 and address is None:
            raise ValueError(
                f"{env.WORLD_SIZE}={world_size} but {env.MASTER_ADDR} is not set, so no process "
                "knows where rank 0's coordinator is. Set MASTER_ADDR (and MASTER_PORT) to rank "
                f"0's host as torchrun does, or {env.JAX_COORDINATOR_ADDRESS}=<host of rank 0>:"
                "<free port>, for every process."
            )
        super().__init__(address, world_size, rank, local_rank=local_rank, rpc_layer=rpc_layer,
                         cluster_spec=_one_node_cluster(address, world_size, local_size))

    @classmethod
    def is_available(cls) -> bool:
        """True when ``WORLD_SIZE`` or ``RANK`` is set.

        One is enough, so that a partial set is reported by the constructor instead of turning
        into single-process training; ``MASTER_ADDR`` alone is not (job scripts export it for
        torchrun before any process group exists).
        """
        return any(os.environ.get(name, "").strip() for name in _GROUP_VARS)
