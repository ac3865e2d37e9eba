"""``detect_cluster_resolver``: pick the cluster resolver that matches this process' environment.

The candidates are tried in a fixed order (``RESOLVERS_IN_ORDER``); the first whose
``is_available()`` is true is built. A candidate that is available but misconfigured raises its
``ValueError`` rather than being skipped, so a broken cluster setup never silently turns into
single-process training.
"""

from __future__ import annotations

import logging
import os

from stratax._src.cluster.jax_env import JAXClusterResolver
from stratax._src.cluster.kubernetes import KubernetesClusterResolver
from stratax._src.cluster.launch_env import LauncherClusterResolver
from stratax._src.cluster.mpi import MPIClusterResolver
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.cluster.slurm import SlurmClusterResolver
from stratax._src.cluster.tfconfig import TFConfigClusterResolver
from stratax._src.cluster.torchrun import TorchrunClusterResolver
from stratax._src.core import env

logger = logging.getLogger(__name__)


# Priority, most specific first: a launcher's variables describe the process group it started and
# beat the scheduler that may have started the launcher (torchrun or mpirun inside a Slurm job or
# a pod); an explicit statement beats what is inferred.
# 1. The stratax launcher's STRATAX_* variables describe exactly the process group the launcher
#    started; they win over everything, because the launcher may itself run inside a Slurm step
#    or a pod and it also writes TF_CONFIG (which agrees with them) on a single node.
# 2. TF_CONFIG is an explicit statement of the cluster by the user or an orchestrator (Kubeflow
#    TFJob, Vertex AI); an explicit statement beats what we could infer from a scheduler, e.g. a
#    user who sets TF_CONFIG inside a Slurm allocation.
# 3. torchrun / Kubeflow PyTorchJob / TorchX: WORLD_SIZE or RANK. torchrun's children are the
#    group even when torchrun runs as a Slurm task (one per node, nproc-per-node children each).
# 4. MPI launchers: OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK (mpirun inside an allocation starts the
#    group; SLURM_* there describe the batch step), except processes srun --mpi started, which
#    MPIClusterResolver.is_available leaves to Slurm.
# 5. A JAX-style job: JAX_NUM_PROCESSES / JAX_PROCESS_ID (with JAX_COORDINATOR_ADDRESS), after the
#    launchers because JAX_COORDINATOR_ADDRESS alone is JAX's coordinator override for them.
# 6. Slurm: SLURM_PROCID plus a task count above 1 (a one-task step is local training), or
#    SLURM_PROCID with no task count: a half-described step is an error, not a lone worker.
# 7. Kubernetes Indexed Job: JOB_COMPLETION_INDEX plus the opt-in STRATAX_K8S_NUM_WORKERS (the
#    index alone also appears in Indexed Jobs used for independent work).
# Nothing matched: local mode, a TFConfigClusterResolver over an empty TF_CONFIG; a leftover
# JAX_COORDINATOR_ADDRESS then is an error (a job half described), not local training.
RESOLVERS_IN_ORDER: tuple[type[ClusterResolver], ...] = (
    LauncherClusterResolver,
    TFConfigClusterResolver,
    TorchrunClusterResolver,
    MPIClusterResolver,
    JAXClusterResolver,
    SlurmClusterResolver,
    KubernetesClusterResolver,
)


def detect_cluster_resolver() -> ClusterResolver:
    """Returns the resolver for this process' environment, local mode if none matches.

    Order: ``stratax launch`` variables (``STRATAX_COORDINATOR_ADDRESS``, ...), ``TF_CONFIG``,
    torchrun / PyTorchJob (``WORLD_SIZE``, ``RANK``), MPI (``OMPI_COMM_WORLD_*``, ``PMI_*``,
    ``PMIX_RANK``), a JAX-style job (``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), Slurm
    (``SLURM_PROCID`` with more than one task, or none stated), Kubernetes Indexed Job
    (``JOB_COMPLETION_INDEX`` with ``STRATAX_K8S_NUM_WORKERS``), else a local-mode
    ``TFConfigClusterResolver``. Explicit resolvers passed to a strategy bypass this.

    Raises:
      ValueError: If the first matching environment is malformed, or nothing matches but
        ``JAX_COORDINATOR_ADDRESS`` is set (the message names the variable and the fix).
    """
    for resolver_cls in RESOLVERS_IN_ORDER:
        if resolver_cls.is_available():
            logger.debug("Cluster environment detected: %s", resolver_cls.__name__)
            return resolver_cls()
    coordinator = os.environ.get(env.JAX_COORDINATOR_ADDRESS, "").strip()
    if coordinator:
        raise ValueError(
            f"{env.JAX_COORDINATOR_ADDRESS}={coordinator!r} is set, but no launcher says how many "
            "processes the job has or which one this is; set "
            f"{env.JAX_NUM_PROCESSES} and {env.JAX_PROCESS_ID} too (or start the program with "
            f"torchrun, mpirun, srun or `stratax launch`), or unset {env.JAX_COORDINATOR_ADDRESS} "
            "for local training."
        )
    logger.debug("No cluster environment detected; running in local mode.")
    return TFConfigClusterResolver()
