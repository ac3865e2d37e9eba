"""``MPIClusterResolver``: the process group of an MPI launcher (Open MPI, MPICH, Intel MPI, PMIx).

``mpirun``/``mpiexec`` tell each process its rank and the world size through environment
variables, one family per implementation (names in ``stratax._src.core.env``):

- Open MPI's ``mpirun``/``mpiexec``/``prterun``: ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``;
- MPICH's and Intel MPI's ``mpiexec`` (Hydra), ``srun --mpi=pmi2``: ``PMI_RANK``/``PMI_SIZE``;
- PMIx launchers (``srun --mpi=pmix``, Open MPI 5): ``PMIX_RANK`` (the size is not exported).

No family names the host of rank 0, which ``jax.distributed`` needs. This resolver follows JAX's
own rules (``jax/_src/clusters/ompi_cluster.py``; reusing JAX's classes would import JAX into
this layer, which must stay importable without it): ``JAX_COORDINATOR_ADDRESS`` if set, else,
under Open MPI <= 4, the host of ``mpirun``'s daemon from ``OMPI_MCA_orte_hnp_uri`` with a port
derived from the job id (or ``JAX_COORDINATOR_PORT``). Anywhere else the user must set
``JAX_COORDINATOR_ADDRESS``, and the error says so.
"""

from __future__ import annotations

import os
import re

from stratax._src.cluster.process_group_resolver import (
    ProcessGroupClusterResolver,
    check_rank,
    coordinator_address_override,
    coordinator_port_override,
)
from stratax._src.cluster.slurm import SlurmClusterResolver
from stratax._src.core import env

# (rank variable, size variable) of each launcher family, in the order they are trusted.
_FAMILIES: tuple[tuple[str, str | None], ...] = (
    (env.OMPI_COMM_WORLD_RANK, env.OMPI_COMM_WORLD_SIZE),
    (env.PMI_RANK, env.PMI_SIZE),
    (env.PMIX_RANK, None),
)
# Set by mpirun/mpiexec themselves, never by srun: their presence says an MPI launcher (not a
# Slurm step) started this process.
_MPIRUN_ONLY = (env.OMPI_COMM_WORLD_RANK, env.MPI_LOCALRANKID)
# As in JAX's OmpiCluster: the IP after "tcp://" (or inside "tcp6://[...]").
_ORTE_HOST = re.compile(r"tcp://(.+?)[,:]|tcp6://\[(.+?)[,\]]")
_SET_COORDINATOR = (
    f"set {env.JAX_COORDINATOR_ADDRESS}=<host of rank 0>:<free port> for every rank, e.g. "
    f"`mpirun -x {env.JAX_COORDINATOR_ADDRESS}=node0:61234 ...` (Open MPI) or "
    f"`mpiexec -genv {env.JAX_COORDINATOR_ADDRESS} node0:61234 ...` (MPICH, Intel MPI)."
)


def _set(name: str) -> bool:
    return bool(os.environ.get(name, "").strip())


def orte_coordinator_address(uri: str) -> str:
    """JAX's coordinator for Open MPI <= 4: ``mpirun``'s host and a port from the job id.

    Same rule as ``OmpiCluster.get_coordinator_address`` in JAX's
    ``jax/_src/clusters/ompi_cluster.py``, so stratax and plain JAX agree on the address: the
    host is the first IP of ``OMPI_MCA_orte_hnp_uri``; the port is ``JAX_COORDINATOR_PORT`` if
    set, else ``(jobid // 4096) % 4096 + 61440`` (Open MPI's job ids are multiples of 4096; the
    range 61440..65535 keeps jobs apart). Rank 0 must run on ``mpirun``'s host, which is
    ``mpirun``'s default placement.

    Raises:
      ValueError: The URI has no job id or no ``tcp://``/``tcp6://`` address.
    """
    match = _ORTE_HOST.search(uri)
    job_id = uri.split(".", maxsplit=1)[0]
    if match is None or not job_id.isdigit():
        raise ValueError(
            f"{env.OMPI_MCA_ORTE_HNP_URI}={uri!r} is not '<jobid>.<vpid>;tcp://<ip>:<port>' as "
            f"Open MPI's mpirun writes it, so the coordinator's host is unknown; "
            + _SET_COORDINATOR
        )
    host = next(group for group in match.groups() if group is not None)
    port = coordinator_port_override()
    if port is None:
        port = int(job_id) // 2**12 % 2**12 + (65535 - 2**12 + 1)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class MPIClusterResolver(ProcessGroupClusterResolver):
    """Reads the process group that ``mpirun``/``mpiexec`` (Open MPI, MPICH, Intel MPI) started.

    Every rank is a ``"worker"`` whose task id is its MPI rank; rank 0 is the chief and hosts
    the ``jax.distributed`` coordinator at ``JAX_COORDINATOR_ADDRESS``, or under Open MPI <= 4
    at the address JAX itself derives (``orte_coordinator_address``). When several families of
    variables are set they must agree.

    A process that ``srun --mpi=pmi2``/``--mpi=pmix`` started directly (``PMI_RANK`` or
    ``PMIX_RANK`` inside a Slurm step of several tasks, no ``mpirun``-only variable, no
    ``JAX_COORDINATOR_ADDRESS``) is left to ``SlurmClusterResolver``, which knows every node.

    Example:
      >>> # mpirun -n 2 -x JAX_COORDINATOR_ADDRESS=node0:61234 python train.py, rank 1:
      >>> resolver = MPIClusterResolver()
      >>> resolver.task_id, resolver.num_processes, resolver.coordinator_address
      (1, 2, 'node0:61234')
    """

    def __init__(self, rpc_layer: str | None = None) -> None:
        """Reads the MPI launcher's variables.

        Args:
          rpc_layer: Protocol prefix of ``master()`` addresses.

        Raises:
          ValueError: No rank variable, a rank without a world size, malformed values, a rank
            outside the world, families that disagree, or several ranks with no coordinator
            address (the message says how to set ``JAX_COORDINATOR_ADDRESS``).
        """
        found = [(rank_name, size_name) for rank_name, size_name in _FAMILIES if _set(rank_name)]
        if not found:
            raise ValueError(
                "No MPI rank variable is set (" + ", ".join(r for r, _ in _FAMILIES) + "); "
                "start the program with mpirun/mpiexec, or pass another cluster resolver."
            )
        rank_name, rank = found[0][0], env.get_int(found[0][0], "", minimum=0)
        size_name, size = self._world_size(found)
        for other_name, _ in found[1:]:
            other = env.get_int(other_name, "", minimum=0)
            if other != rank:
                raise ValueError(
                    f"{rank_name}={rank} but {other_name}={other}: two MPI launchers' variables "
                    "disagree (one is probably inherited from an outer job); unset the stale "
                    "ones or start the program with a single launcher."
                )
        check_rank(rank_name, rank, size_name, size)
        address = self._coordinator() if size > 1 else None
        if size > 1 and address is None:
            raise ValueError(
                f"{rank_name}={rank} of {size_name}={size}: the MPI launcher does not say which "
                "host rank 0 (the jax.distributed coordinator) runs on; " + _SET_COORDINATOR
            )
        local_rank = env.get_optional_int(
            env.OMPI_COMM_WORLD_LOCAL_RANK if _set(env.OMPI_COMM_WORLD_LOCAL_RANK)
            else env.MPI_LOCALRANKID, minimum=0)
        super().__init__(address, size, rank, local_rank=local_rank, rpc_layer=rpc_layer)

    @staticmethod
    def _world_size(found: list[tuple[str, str | None]]) -> tuple[str, int]:
        sizes = [(name, env.get_int(name, "", minimum=1))
                 for _, name in found if name is not None and _set(name)]
        if not sizes:
            names = " or ".join(name for _, name in _FAMILIES if name is not None)
            raise ValueError(
                f"{found[0][0]} is set but no world size ({names}); the launcher exports only "
                "the rank (PMIx does): start the program with mpirun/mpiexec, which set the "
                "size, or with srun inside a Slurm step of several tasks."
            )
        for name, size in sizes[1:]:
            if size != sizes[0][1]:
                raise ValueError(
                    f"{sizes[0][0]}={sizes[0][1]} but {name}={size}: two MPI launchers' "
                    "variables disagree; unset the stale ones."
                )
        return sizes[0]

    @staticmethod
    def _coordinator() -> str | None:
        explicit = coordinator_address_override()
        if explicit is not None:
            return explicit
        uri = os.environ.get(env.OMPI_MCA_ORTE_HNP_URI, "").strip()
        return orte_coordinator_address(uri) if uri else None

    @classmethod
    def is_available(cls) -> bool:
        """True when an MPI rank variable is set, unless ``srun --mpi`` started the process.

        ``srun --mpi=pmi2``/``pmix`` exports ``PMI_RANK``/``PMIX_RANK`` next to Slurm's own
        variables, which describe the same tasks and also list every node, so such a process is
        left to ``SlurmClusterResolver``. The test uses only variables every rank sees alike
        (never the rank itself), so all ranks of a job pick the same resolver.
        """
        if not any(_set(rank_name) for rank_name, _ in _FAMILIES):
            return False
        started_by_srun = (not any(_set(name) for name in _MPIRUN_ONLY)
                           and not _set(env.JAX_COORDINATOR_ADDRESS)
                           and SlurmClusterResolver.is_available())
        return not started_by_srun
