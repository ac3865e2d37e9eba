"""Cluster configuration: ``ClusterSpec``, cluster resolvers and their auto-detection.

Pure configuration read from the environment: nothing in this package imports JAX or Keras,
opens a socket or starts a process, so it can be tested with a patched environment alone.
"""

from stratax._src.cluster.cluster_spec import ClusterSpec, parse_address
from stratax._src.cluster.detect import RESOLVERS_IN_ORDER, detect_cluster_resolver
from stratax._src.cluster.jax_env import JAXClusterResolver
from stratax._src.cluster.kubernetes import KubernetesClusterResolver
from stratax._src.cluster.launch_env import LauncherClusterResolver
from stratax._src.cluster.mpi import MPIClusterResolver
from stratax._src.cluster.process_group_resolver import ProcessGroupClusterResolver
from stratax._src.cluster.process_layout import ProcessLayout, process_layout
from stratax._src.cluster.resolver import ClusterResolver, format_master_url
from stratax._src.cluster.simple import SimpleClusterResolver
from stratax._src.cluster.slurm import SlurmClusterResolver
from stratax._src.cluster.slurm_hostlist import expand_hostlist, expand_tasks_per_node
from stratax._src.cluster.tfconfig import TFConfig, TFConfigClusterResolver, parse_tf_config
from stratax._src.cluster.torchrun import TorchrunClusterResolver
from stratax._src.cluster.tpu import TPUClusterResolver

__all__ = [
    "RESOLVERS_IN_ORDER",
    "ClusterResolver",
    "ClusterSpec",
    "JAXClusterResolver",
    "KubernetesClusterResolver",
    "LauncherClusterResolver",
    "MPIClusterResolver",
    "ProcessGroupClusterResolver",
    "ProcessLayout",
    "SimpleClusterResolver",
    "SlurmClusterResolver",
    "TFConfig",
    "TFConfigClusterResolver",
    "TPUClusterResolver",
    "TorchrunClusterResolver",
    "detect_cluster_resolver",
    "expand_hostlist",
    "expand_tasks_per_node",
    "format_master_url",
    "parse_address",
    "parse_tf_config",
    "process_layout",
]
