"""Cluster resolvers, as ``tf.distribute.cluster_resolver`` offers them: ``sx.cluster_resolver``."""

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.cluster.detect import detect_cluster_resolver
from stratax._src.cluster.jax_env import JAXClusterResolver
from stratax._src.cluster.kubernetes import KubernetesClusterResolver
from stratax._src.cluster.launch_env import LauncherClusterResolver
from stratax._src.cluster.mpi import MPIClusterResolver
from stratax._src.cluster.process_layout import ProcessLayout, process_layout
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.cluster.simple import SimpleClusterResolver
from stratax._src.cluster.slurm import SlurmClusterResolver
from stratax._src.cluster.tfconfig import TFConfigClusterResolver
from stratax._src.cluster.torchrun import TorchrunClusterResolver
from stratax._src.cluster.tpu import TPUClusterResolver

__all__ = [
    "ClusterResolver",
    "ClusterSpec",
    "JAXClusterResolver",
    "KubernetesClusterResolver",
    "LauncherClusterResolver",
    "MPIClusterResolver",
    "ProcessLayout",
    "SimpleClusterResolver",
    "SlurmClusterResolver",
    "TFConfigClusterResolver",
    "TPUClusterResolver",
    "TorchrunClusterResolver",
    "detect_cluster_resolver",
    "process_layout",
]
