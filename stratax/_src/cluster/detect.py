"""``detect_cluster_resolver``: pick the cluster resolver that matches this process' environment.

The candidates are tried in a fixed order (``RESOLVERS_IN_ORDER``); the first whose
``is_available()`` is true is built. A candidate that is available but misconfigured raises its
``ValueError`` rather than being skipped, so a broken cluster setup never silently turns into
single-process training.
"""

from __future__ import annotations

import logging

from stratax._src.cluster.kubernetes import KubernetesClusterResolver
from stratax._src.cluster.launcher import LauncherClusterResolver
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.cluster.slurm import SlurmClusterResolver
from stratax._src.cluster.tfconfig import TFConfigClusterResolver

logger = logging.getLogger(__name__)


# Priority, most specific first:
# 1. The stratax launcher's STRATAX_* variables describe exactly the process group the launcher
#    started; they win over everything, because the launcher may itself run inside a Slurm step
#    or a pod and it also writes TF_CONFIG (which agrees with them) on a single node.
# 2. TF_CONFIG is an explicit statement of the cluster by the user or an orchestrator (Kubeflow
#    TFJob, Vertex AI); an explicit statement beats what we could infer from a scheduler, e.g. a
#    user who sets TF_CONFIG inside a Slurm allocation.
# 3. Slurm: SLURM_PROCID plus a task count above 1 (a one-task step is local training).
# 4. Kubernetes Indexed Job: JOB_COMPLETION_INDEX plus the opt-in STRATAX_K8S_NUM_WORKERS (the
#    index alone also appears in Indexed Jobs used for independent work).
# Nothing matched: local mode, a TFConfigClusterResolver over an empty TF_CONFIG.
RESOLVERS_IN_ORDER: tuple[type[ClusterResolver], ...] = (
    LauncherClusterResolver,
    TFConfigClusterResolver,
    SlurmClusterResolver,
    KubernetesClusterResolver,
)


def detect_cluster_resolver() -> ClusterResolver:
    """Returns the resolver for this process' environment, local mode if none matches.

    Order: ``stratax launch`` variables (``STRATAX_COORDINATOR_ADDRESS``, ...), ``TF_CONFIG``,
    Slurm (``SLURM_PROCID`` with more than one task), Kubernetes Indexed Job
    (``JOB_COMPLETION_INDEX`` with ``STRATAX_K8S_NUM_WORKERS``), else a local-mode
    ``TFConfigClusterResolver``. Explicit resolvers passed to a strategy bypass this.

    Raises:
      ValueError: If the first matching environment is malformed (the message names the
        variable and the fix).
    """
    for resolver_cls in RESOLVERS_IN_ORDER:
        if resolver_cls.is_available():
            logger.debug("Cluster environment detected: %s", resolver_cls.__name__)
            return resolver_cls()
    logger.debug("No cluster environment detected; running in local mode.")
    return TFConfigClusterResolver()
