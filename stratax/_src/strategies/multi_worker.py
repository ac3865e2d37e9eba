"""``MultiWorkerMirroredStrategy``: synchronous data parallelism over every device of every
worker."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax

from stratax._src import seam
from stratax._src.cluster.detect import detect_cluster_resolver
from stratax._src.cluster.process_group import ProcessGroupClusterResolver
from stratax._src.cluster.process_layout import ProcessLayout
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.cluster.sync_group import process_layout
from stratax._src.runtime import distributed
from stratax._src.strategies.base import Strategy

DEFAULT_TIMEOUT_SECONDS = 120.0


class CommunicationImplementation(enum.Enum):
    """The transport between workers: TensorFlow's three names and stratax's CPU transports.

    ``AUTO``: on CPU the shared-memory all-reduce when every process is on one host with one
    CPU device (else gloo), on GPU NCCL. ``RING``: TensorFlow's ring all-reduce, gloo's on CPU.
    ``NCCL``: GPUs only. ``GLOO``, ``SHM`` (gloo plus the shared-memory all-reduce; an error
    where impossible) and ``MPI``: the CPU collectives of the same names (docs/transport.md).
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"
    GLOO = "GLOO"
    SHM = "SHM"
    MPI = "MPI"


# The CPU collectives (``runtime.cpu_collectives``) each implementation selects; NCCL none.
_CPU_COLLECTIVES = {
    CommunicationImplementation.AUTO: "auto",
    CommunicationImplementation.RING: "gloo",
    CommunicationImplementation.GLOO: "gloo",
    CommunicationImplementation.SHM: "shm",
    CommunicationImplementation.MPI: "mpi",
}


@dataclasses.dataclass(frozen=True)
class CommunicationOptions:
    """How the workers talk: TensorFlow's ``tf.distribute.experimental.CommunicationOptions``.

    Args:
        bytes_per_pack: ``all_reduce`` inside ``strategy.run``, and ``fit``'s packed train
            step with its gradients, concatenate the tensors of one dtype into flat packs of at
            most this many bytes and reduce each pack with one collective (XLA on CPU otherwise
            calls the transport once per tensor, each call a network round trip). 0 (default)
            = automatic: 32 MiB packs. A tensor larger than a pack travels alone. The
            same-host shared-memory all-reduce takes the tensors it handles without that copy
            and packs them into its own slots (option ``shm_slot_bytes``) instead (see
            docs/transport.md).
        timeout_seconds: bound on every blocking wait between workers (start-up rendezvous,
            heartbeats that detect a dead peer, shutdown). Default 120 s; TensorFlow's default
            (no timeout) would allow a silent hang, which stratax never does.
        implementation: the transport switch: a ``CommunicationImplementation`` or its name,
            ``"auto"``, ``"gloo"``, ``"shm"``, ``"mpi"``, ``"ring"`` or ``"nccl"``, any case.
            ``None`` (default): option ``cpu_collectives`` (``sx.config``, environment
            variable ``STRATAX_CPU_COLLECTIVES``), else ``"auto"``.

    Example:
        >>> options = sx.CommunicationOptions(implementation="gloo", timeout_seconds=60)
        >>> strategy = sx.MultiWorkerMirroredStrategy(communication_options=options)
    """

    bytes_per_pack: int = 0
    timeout_seconds: float | None = None
    implementation: CommunicationImplementation | str | None = None

    def __post_init__(self) -> None:
        if self.bytes_per_pack < 0:
            raise ValueError(f"bytes_per_pack must be >= 0; received {self.bytes_per_pack}.")
        if self.timeout_seconds is not None and self.timeout_seconds <= 0:
            raise ValueError(
                f"timeout_seconds must be positive; received {self.timeout_seconds}. "
                "Use None for the default of 120 s."
            )
        if self.implementation is not None and not isinstance(
                self.implementation, CommunicationImplementation):
            try:
                value = CommunicationImplementation(str(self.implementation).strip().upper())
            except ValueError:
                raise ValueError(
                    f"Unknown implementation {self.implementation!r}; use one of "
                    f"{[i.name for i in CommunicationImplementation]} (or its name in lower "
                    "case), or None for option cpu_collectives."
                ) from None
            object.__setattr__(self, "implementation", value)

    @property
    def effective_timeout(self) -> float:
        return self.timeout_seconds if self.timeout_seconds is not None else DEFAULT_TIMEOUT_SECONDS

    @property
    def cpu_collectives(self) -> str | None:
        """The CPU collectives ``implementation`` asks for, or ``None`` (unset, or ``NCCL``)."""
        return _CPU_COLLECTIVES.get(self.implementation)


def _task_names(resolver: ClusterResolver, layout: ProcessLayout) -> dict[int, str]:
    """``"worker 1 (host:port)"``-style names of the processes, for error messages."""
    spec = resolver.cluster_spec() if layout.num_processes > 1 else None
    jobs = spec.as_dict() if spec else {}
    chiefs = 1 if "chief" in jobs else 0
    names = {}
    for process in range(layout.num_processes):
        job, index = ("chief", 0) if chiefs and process == 0 else ("worker", process - chiefs)
        try:
            names[process] = f"{job} {index} ({spec.task_address(job, index)})"
        except (AttributeError, KeyError, IndexError, ValueError):
            names[process] = f"{job} {index}"
    return names


def check_cores_per_replica(cores_per_replica: int | None, devices: list[jax.Device]) -> None:
    """Refuses a ``cores_per_replica`` that does not group ``devices`` (process-major) into
    replicas each inside one process or spanning whole processes.

    Raises:
        ValueError: naming the value, the device counts and what would fit.
    """
    if cores_per_replica is None:
        return
    per_process: dict[int, int] = {}
    for device in devices:
        per_process[device.process_index] = per_process.get(device.process_index, 0) + 1
    local = per_process[jax.process_index()]
    total = len(devices)
    if (isinstance(cores_per_replica, bool) or not isinstance(cores_per_replica, int)
            or cores_per_replica < 1 or total % cores_per_replica):
        raise ValueError(
            f"cores_per_replica={cores_per_replica!r} must be a positive integer dividing the "
            f"{total} devices of the {len(per_process)} worker(s)."
        )
    if len(set(per_process.values())) > 1:
        raise ValueError(
            f"cores_per_replica={cores_per_replica} needs the same number of devices in every "
            f"worker; they have {sorted(per_process.values())}. Give each worker as many "
            "(e.g. STRATAX_CPU_DEVICES on CPU)."
        )
    if local % cores_per_replica and cores_per_replica % local:
        fits = sorted({c for c in range(1, total + 1)
                       if total % c == 0 and (local % c == 0 or c % local == 0)})
        raise ValueError(
            f"cores_per_replica={cores_per_replica} splits a replica unevenly between workers "
            f"of {local} devices each: a replica must lie inside one worker or span whole "
            f"workers. Use one of {fits}."
        )


class MultiWorkerMirroredStrategy(Strategy):
    """One replica per device of every worker process; gradients all-reduced across workers.

    Every worker runs the same program. Membership comes from the environment, as in
    TensorFlow: ``TF_CONFIG`` (Kubeflow TFJob or by hand), Slurm, a Kubernetes Indexed Job or
    ``stratax launch`` (see ``sx.cluster_resolver.detect_cluster_resolver`` for the order).
    With no cluster it runs in local mode, like ``MirroredStrategy``. Create it at the top of the
    program, before any JAX computation: it joins the workers with ``jax.distributed``.

    Args:
        cluster_resolver: where the cluster comes from; auto-detected when ``None``.
        communication_options: timeouts, pack size and the transport
            (``CommunicationOptions(implementation=...)``).
        cores_per_replica: Model parallelism across the workers' devices: replicas of this
            many devices each (a ``("replica", "core")`` mesh over every device of every
            worker, as ``MirroredStrategy``'s in one process). It divides each worker's device
            count (replicas inside a worker) or is a multiple of it (a replica spanning whole
            workers, which then feed it the same rows).
        layout_map: A ``keras.distribution.LayoutMap`` splitting variables (and their optimizer
            slots) over the mesh axes: a variable split over ``"core"`` (or ``"replica"``) is
            held in parts by the workers whose devices hold them.

    Example:
        >>> strategy = sx.MultiWorkerMirroredStrategy()
        >>> with strategy.scope():
        ...     model = keras.Sequential([keras.layers.Dense(10)])
        ...     model.compile(optimizer="adam", loss="mse")
        >>> model.fit(x, y, batch_size=256)      # 256 = global batch over all workers
    """

    def __init__(
        self,
        cluster_resolver: ClusterResolver | None = None,
        communication_options: CommunicationOptions | None = None,
        *,
        cores_per_replica: int | None = None,
        layout_map: Any = None,
    ) -> None:
        if seam.importing_main_for_a_child():
            raise RuntimeError(
                "MultiWorkerMirroredStrategy() ran while multiprocessing imported the main "
                "script in a child process (a PyDataset's workers with use_multiprocessing=True, "
                "a 'spawn' or 'forkserver' pool), which would join the cluster a second time. "
                'Put the script\'s training under `if __name__ == "__main__":`.'
            )
        self._resolver = cluster_resolver or detect_cluster_resolver()
        self._options = communication_options or CommunicationOptions()
        self._layout = process_layout(self._resolver)
        if (self._options.implementation is CommunicationImplementation.NCCL
                and self._layout.num_processes > 1 and jax.default_backend() != "gpu"):
            raise ValueError(
                "CommunicationImplementation.NCCL needs GPUs; this process has none. Use AUTO."
            )
        distributed.initialize(
            self._layout,
            timeout_seconds=self._options.effective_timeout,
            task_names=_task_names(self._resolver, self._layout),
            implementation=self._options.cpu_collectives,
        )
        if (isinstance(self._resolver, ProcessGroupClusterResolver)
                and self._layout.num_processes > 1 and not self._resolver.lists_every_worker()):
            # torchrun across nodes, mpirun: the environment named the coordinator only.
            self._resolver.list_workers(
                distributed.gathered_hosts(self._options.effective_timeout))
            distributed.runtime.task_names = _task_names(self._resolver, self._layout)
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        check_cores_per_replica(cores_per_replica, devices)
        super().__init__(devices, cores_per_replica=cores_per_replica, layout_map=layout_map)

    @property
    def cluster_resolver(self) -> ClusterResolver:
        return self._resolver

    @property
    def communication_options(self) -> CommunicationOptions:
        return self._options

    @property
    def bytes_per_pack(self) -> int:
        return self._options.bytes_per_pack

    @property
    def num_workers(self) -> int:
        return self._layout.num_processes

    @property
    def worker_index(self) -> int:
        """This process's index among the workers (0 = the chief or worker 0)."""
        return self._layout.process_id

    def __repr__(self) -> str:
        return (f"MultiWorkerMirroredStrategy(num_workers={self.num_workers}, "
                f"num_replicas_in_sync={self.num_replicas_in_sync})")
