"""Connecting to and initialising the TPU system: TensorFlow's two TPU start-up calls on JAX.

``experimental_connect_to_cluster(resolver)`` joins the hosts of a pod slice (``jax.distributed``;
nothing to do on one host) and must run before any JAX computation, as in TensorFlow.
``initialize_tpu_system(resolver)`` finds the TPU cores and returns their ``Topology``. Without a
TPU both fail with an error that says how to switch emulation on; with emulation (explicit:
``STRATAX_TPU_EMULATION=N`` or ``TPUClusterResolver(emulation_cores=N)``) N CPU devices act as
the cores, and the log says so. Emulation with several hosts listed (``TPU_WORKER_HOSTNAMES``)
is an emulated pod slice: the processes join with ``jax.distributed`` exactly as a pod's hosts
do, and each gives N of its CPU devices.
"""

from __future__ import annotations

import logging
from typing import Any

import jax

from stratax._src.cluster.tpu import TPUClusterResolver
from stratax._src.core import env
from stratax._src.runtime import distributed
from stratax._src.runtime.devices import jax_started
from stratax._src.runtime.tpu_topology import Topology

logger = logging.getLogger(__name__)

# Hosts of a pod slice boot at different times; bound the start-up rendezvous generously.
JOIN_TIMEOUT_SECONDS = 300.0


class _TPUSystem:
    """What this process connected to and initialised (one per process)."""

    def __init__(self) -> None:
        self.resolver: TPUClusterResolver | None = None
        self.topology: Topology | None = None


system = _TPUSystem()


def _check_resolver(resolver: Any) -> TPUClusterResolver:
    if not isinstance(resolver, TPUClusterResolver):
        raise TypeError(
            f"Expected a TPUClusterResolver; received {resolver!r}. For CPU/GPU workers use "
            "sx.MultiWorkerMirroredStrategy(cluster_resolver), which joins them itself."
        )
    return resolver


def experimental_connect_to_cluster(
    cluster_spec_or_resolver: Any = None,
    job_name: str = "localhost",
    task_index: int = 0,
    protocol: str | None = None,
    make_master_device_default: bool = True,
    cluster_device_filters: Any = None,
) -> None:
    """Joins the hosts of this TPU slice (``tf.config.experimental_connect_to_cluster``).

    On one host (and under single-host emulation) there is nothing to join. On a pod slice
    (real or emulated) every host runs the program and this call starts ``jax.distributed``
    with the coordinator on host 0; the hosts come from the environment, or from the TPU VM's
    metadata through JAX's own detection.
    The remaining arguments are TensorFlow's and are not needed on JAX.

    Raises:
        TypeError: the argument is not a ``TPUClusterResolver``.
        RuntimeError: JAX already started in this process, so it can no longer join a pod.
    """
    del job_name, task_index, protocol, make_master_device_default, cluster_device_filters
    resolver = _check_resolver(cluster_spec_or_resolver or TPUClusterResolver())
    args = resolver.distributed_init_args()
    if args is not None and not jax.distributed.is_initialized():
        if jax_started():
            raise RuntimeError(
                "JAX already started in this process, so it can no longer join the other hosts "
                "of the TPU pod. Call sx.config.experimental_connect_to_cluster(resolver) at the "
                "top of the program, before any JAX computation."
            )
        if args:
            layout = resolver.explicit_process_layout()
            names = {p: f"TPU host {p}" for p in range(layout.num_processes)}
            distributed.initialize(layout, timeout_seconds=JOIN_TIMEOUT_SECONDS, task_names=names)
        else:
            logger.info("Joining the TPU pod's hosts (found by JAX from the TPU VM metadata).")
            timeout = int(JOIN_TIMEOUT_SECONDS)
            jax.distributed.initialize(initialization_timeout=timeout,
                                       heartbeat_timeout_seconds=timeout,
                                       shutdown_timeout_seconds=timeout)
    system.resolver = resolver


def _emulated_devices(cores: int) -> list[Any]:
    """The first ``cores`` CPU devices of every process (host), host by host: the cores of an
    emulated TPU host, or of each host of an emulated pod slice."""
    by_host: dict[int, list[Any]] = {}
    for device in jax.devices("cpu"):
        by_host.setdefault(device.process_index, []).append(device)
    local = len(by_host.get(jax.process_index(), ()))
    if local < cores:
        raise RuntimeError(
            f"TPU emulation with {cores} cores needs {cores} CPU devices, but JAX has "
            f"{local}. Split the CPU before JAX starts: {env.STRATAX_CPU_DEVICES}={cores} "
            f"in the environment, or sx.set_cpu_device_count({cores}) at the top of the program."
        )
    return [device for host in sorted(by_host) for device in by_host[host][:cores]]


def _tpu_devices() -> list[Any]:
    try:
        devices = jax.devices("tpu")
    except RuntimeError:
        devices = []
    if devices:
        return list(devices)
    found = ", ".join(sorted({d.platform for d in jax.devices()}))
    raise RuntimeError(
        f"No TPU found: JAX sees only {found} devices ({jax.device_count()}). On a TPU VM or "
        "a Colab TPU runtime install JAX for TPU (`pip install 'jax[tpu]'`). To run a TPU "
        f"program without a TPU, for testing, switch emulation on explicitly: "
        f"{env.STRATAX_TPU_EMULATION}=8 {env.STRATAX_CPU_DEVICES}=8 in the environment, or "
        "TPUClusterResolver(emulation_cores=8) after sx.set_cpu_device_count(8)."
    )


def initialize_tpu_system(cluster_resolver: TPUClusterResolver | None = None) -> Topology:
    """Finds the TPU cores and returns their ``Topology`` (``tf.tpu.experimental``'s call).

    Connects first when ``experimental_connect_to_cluster`` was not called. Calling it again
    returns the topology found the first time (TensorFlow re-initialises and clears caches;
    call ``shutdown_tpu_system`` for that).

    Raises:
        RuntimeError: no TPU and emulation is off, or emulation lacks CPU devices.
    """
    resolver = _check_resolver(cluster_resolver or system.resolver or TPUClusterResolver())
    if system.topology is not None and system.resolver is resolver:
        return system.topology
    if system.resolver is not resolver:
        experimental_connect_to_cluster(resolver)
    cores = resolver.emulation_cores
    devices = _emulated_devices(cores) if cores else _tpu_devices()
    topology = Topology(devices, emulated=bool(cores))
    if cores:
        logger.warning(
            "TPU system emulated on %d CPU devices (%s / emulation_cores): no TPU is used; "
            "for testing TPU programs only. %r", cores, env.STRATAX_TPU_EMULATION, topology)
    else:
        logger.info("TPU system initialized: %d TPU cores on %d host(s), %s. %r",
                    len(devices), topology.num_tasks, resolver.accelerator_type or "TPU",
                    topology)
    system.topology = topology
    return topology


def shutdown_tpu_system(cluster_resolver: TPUClusterResolver | None = None) -> None:
    """Forgets the initialised topology and clears JAX's compilation caches."""
    del cluster_resolver
    system.topology = None
    jax.clear_caches()
