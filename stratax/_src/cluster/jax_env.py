"""``JAXClusterResolver``: a job described by the arguments of ``jax.distributed.initialize``.

Job scripts written for plain JAX export ``JAX_COORDINATOR_ADDRESS`` (which
``jax.distributed.initialize()`` reads itself), ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``
(its ``num_processes`` and ``process_id`` arguments) and call ``initialize`` with them. This
resolver reads the same three variables, so such a script runs under stratax unchanged.
"""

from __future__ import annotations

import os

from stratax._src.cluster.process_group_resolver import (
    ProcessGroupClusterResolver,
    check_rank,
    coordinator_address_override,
)
from stratax._src.core import env

_SET_ALL_THREE = (
    f"a JAX-style job sets {env.JAX_COORDINATOR_ADDRESS}=<host of process 0>:<port>, "
    f"{env.JAX_NUM_PROCESSES} and {env.JAX_PROCESS_ID} for every process; set the missing one "
    "or unset the others for local training."
)


class JAXClusterResolver(ProcessGroupClusterResolver):
    """Reads ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``.

    Every process is a ``"worker"`` whose task id is ``JAX_PROCESS_ID``; process 0 is the chief
    and hosts the coordinator at ``JAX_COORDINATOR_ADDRESS``, exactly as
    ``jax.distributed.initialize`` would be called.

    Example:
      >>> # JAX_COORDINATOR_ADDRESS=node0:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=1
      >>> resolver = JAXClusterResolver()
      >>> resolver.task_id, resolver.num_processes, resolver.coordinator_address
      (1, 2, 'node0:1234')
    """

    def __init__(self, rpc_layer: str | None = None) -> None:
        """Reads the three variables.

        Args:
          rpc_layer: Protocol prefix of ``master()`` addresses.

        Raises:
          ValueError: A variable missing (the coordinator may be missing only for one process)
            or malformed, or a process id outside the job.
        """
        num_processes = env.get_int(env.JAX_NUM_PROCESSES, _SET_ALL_THREE, minimum=1)
        process_id = env.get_int(env.JAX_PROCESS_ID, _SET_ALL_THREE, minimum=0)
        check_rank(env.JAX_PROCESS_ID, process_id, env.JAX_NUM_PROCESSES, num_processes)
        address = coordinator_address_override()
        if address is None and num_processes > 1:
            raise ValueError(
                f"{env.JAX_NUM_PROCESSES}={num_processes} but {env.JAX_COORDINATOR_ADDRESS} is "
                "not set (or empty); " + _SET_ALL_THREE
            )
        super().__init__(address, num_processes, process_id, rpc_layer=rpc_layer)

    @classmethod
    def is_available(cls) -> bool:
        """True when ``JAX_NUM_PROCESSES`` or ``JAX_PROCESS_ID`` is set.

        ``JAX_COORDINATOR_ADDRESS`` alone is JAX's coordinator override, which the torchrun and
        MPI resolvers honour; ``detect_cluster_resolver`` reports it when nothing else uses it.
        """
        return any(os.environ.get(name, "").strip()
                   for name in (env.JAX_NUM_PROCESSES, env.JAX_PROCESS_ID))
