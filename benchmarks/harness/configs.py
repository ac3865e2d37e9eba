"""What is benchmarked: workloads, systems, and the named benchmarks that combine them.

Pure data, no framework import: the parent, the dry run and every child (in any virtual
environment) read the same definitions, so a configuration means the same thing everywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

GLOBAL_BATCH = 256
SEED = 1234
Mode = Literal["full", "quick"]
Device = Literal["cpu", "gpu"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model plus the shape of its synthetic data and how long to train it.

    Example::

        WORKLOADS["mlp"].steps("quick", 32)   # (steps per epoch, timed epochs)
    """

    name: str
    title: str
    input_shape: tuple[int, ...]
    num_classes: int
    # (steps per epoch, timed epochs) after one warm-up epoch; steps per epoch is rounded up
    # to a multiple of steps_per_execution, so every execution is full.
    full: tuple[int, int]
    quick: tuple[int, int]
    timeout_s: dict[str, int]

    def steps(self, mode: Mode, spe: int) -> tuple[int, int]:
        """Return (steps per epoch, timed epochs) for ``mode`` and ``steps_per_execution``."""
        per_epoch, timed = self.full if mode == "full" else self.quick
        return -(-per_epoch // spe) * spe, timed

    def total_steps(self, mode: Mode, spe: int) -> int:
        """Optimizer steps of one run (warm-up epoch included): the final loss is taken here."""
        per_epoch, timed = self.steps(mode, spe)
        return per_epoch * (WARMUP_EPOCHS + timed)


WARMUP_EPOCHS = 1

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("mlp", "MLP 784-128-10", (784,), 10, (64, 20), (32, 12),
                 {"full": 600, "quick": 240}),
        Workload("wide_mlp", "MLP 784-1024-1024-10", (784,), 10, (64, 4), (32, 2),
                 {"full": 900, "quick": 300}),
        Workload("cnn", "CNN 32x32x3 (conv32-pool-conv64-pool-128-10)", (32, 32, 3), 10,
                 (32, 2), (8, 2), {"full": 1200, "quick": 300}),
        Workload("resnet50", "ResNet-50, 32x32x3, 10 classes", (32, 32, 3), 10, (64, 2),
                 (32, 1), {"full": 900, "quick": 300}),
    )
}


@dataclasses.dataclass(frozen=True)
class System:
    """One way of training: a framework, a strategy and how its process(es) are laid out.

    Example::

        SYSTEMS["sx-mirrored-2dev"].processes   # 1 process, 2 forced XLA host devices
    """

    name: str
    label: str
    family: Literal["tf", "keras-jax", "stratax", "torch"]
    strategy: Literal["none", "onedevice", "mirrored", "mwms", "dataparallel", "ddp"]
    processes: int = 1
    # Pin process i to CPU core i (os.sched_setaffinity) before any framework starts.
    pin: bool = False
    # Forced XLA host devices (--xla_force_host_platform_device_count), JAX systems only.
    xla_devices: int | None = None
    # Logical CPU devices made by tf.config.set_logical_device_configuration, TF only.
    tf_logical_cpus: int | None = None
    # A callback with on_train_batch_end makes Keras wait for every step (see README).
    block_each_step: bool = False
    # TF only: tf.keras is tf-keras (Keras 2, TF_USE_LEGACY_KERAS=1), as TF's multi-worker
    # guide requires; otherwise tf.keras is Keras 3 on the TensorFlow backend.
    legacy_keras: bool = False
    # stratax only: batches fit places ahead of the step (STRATAX_PREFETCH_DEPTH; None = default).
    prefetch: int | None = None
    # stratax MWMS only: JAX's CPU collectives between the processes. "mpi" starts the
    # processes with one mpiexec and needs MPITRAMPOLINE_LIB (docs/transport.md); "shm" is
    # stratax's same-host shared-memory all-reduce (STRATAX_CPU_COLLECTIVES=shm).
    transport: Literal["gloo", "mpi", "shm"] = "gloo"
    # stratax only: False cuts every batch on the host and places it, as releases before
    # array input kept on the devices did (STRATAX_RESIDENT_ARRAY_BYTES=0).
    resident_arrays: bool = True
    # stratax only: False keeps fit's optimizer update replicated on every process, as before
    # it was sharded over them (STRATAX_SHARDED_UPDATE=off).
    sharded_update: bool = True
    note: str = ""

    @property
    def env(self) -> Literal["tf", "torch", "project"]:
        """Which interpreter runs it: a peer's virtual environment or the project's own."""
        return self.family if self.family in ("tf", "torch") else "project"  # type: ignore[return-value]

    @property
    def replicas(self) -> int:
        """Replicas the global batch is split over (for divisibility checks)."""
        if self.strategy in ("mwms", "ddp"):
            return self.processes
        return self.xla_devices or self.tf_logical_cpus or 1


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("tf-none", "TF, no strategy", "tf", "none"),
        System("tf-mirrored-1cpu", "TF MirroredStrategy, default devices", "tf", "mirrored"),
        System("tf-mirrored-2lcpu", "TF MirroredStrategy, 2 logical CPUs", "tf", "mirrored",
               tf_logical_cpus=2),
        System("tf-1proc-1core", "TF + tf-keras (Keras 2), no strategy, 1 process on 1 core",
               "tf", "none", pin=True, legacy_keras=True),
        System("tf-mwms-2proc", "TF MultiWorkerMirroredStrategy + tf-keras (Keras 2), "
               "2 processes x 1 core", "tf", "mwms", processes=2, pin=True, legacy_keras=True),
        System("tf-mwms-2proc-k3", "TF MultiWorkerMirroredStrategy + Keras 3, 2 processes x 1 core",
               "tf", "mwms", processes=2, pin=True,
               note="Keras 3 does not support MWMS in fit (keras-team/keras#20585)"),
        System("kjax-single", "Keras 3 JAX, one device", "keras-jax", "none"),
        System("kjax-dp-2dev", "Keras 3 JAX DataParallel, 2 forced devices (host waits each step)",
               "keras-jax", "dataparallel", xla_devices=2, block_each_step=True,
               note="blocking callback: async dispatch deadlocks XLA CPU collectives"),
        System("sx-onedevice", "stratax OneDeviceStrategy", "stratax", "onedevice"),
        System("sx-mirrored-1", "stratax MirroredStrategy, default devices", "stratax",
               "mirrored"),
        System("sx-mirrored-2dev", "stratax MirroredStrategy, 2 forced devices", "stratax",
               "mirrored", xla_devices=2),
        System("sx-onedevice-noprefetch", "stratax OneDeviceStrategy, no prefetch thread",
               "stratax", "onedevice", prefetch=0),
        System("sx-mirrored-2dev-noprefetch", "stratax MirroredStrategy, 2 forced devices, "
               "no prefetch thread", "stratax", "mirrored", xla_devices=2, prefetch=0),
        System("sx-1proc-1core", "stratax OneDeviceStrategy, 1 process on 1 core", "stratax",
               "onedevice", pin=True),
        System("sx-mwms-2proc", "stratax MultiWorkerMirroredStrategy, 2 processes x 1 core",
               "stratax", "mwms", processes=2, pin=True),
        System("sx-mwms-2proc-mpi", "stratax MultiWorkerMirroredStrategy, 2 processes x 1 core, "
               "MPI collectives (MPICH, shared memory)", "stratax", "mwms", processes=2,
               pin=True, transport="mpi"),
        System("sx-mwms-2proc-shm", "stratax MultiWorkerMirroredStrategy, 2 processes x 1 core, "
               "shared-memory all-reduce (STRATAX_CPU_COLLECTIVES=shm)", "stratax", "mwms",
               processes=2, pin=True, transport="shm"),
        System("sx-mwms-2proc-shm-repl", "stratax MultiWorkerMirroredStrategy, 2 processes x 1 "
               "core, shared-memory all-reduce, optimizer update replicated on each process "
               "(STRATAX_SHARDED_UPDATE=off)", "stratax", "mwms", processes=2, pin=True,
               transport="shm", sharded_update=False),
        System("sx-1proc-1core-host", "stratax OneDeviceStrategy, 1 process on 1 core, batches "
               "placed from the host (STRATAX_RESIDENT_ARRAY_BYTES=0)", "stratax", "onedevice",
               pin=True, resident_arrays=False),
        System("sx-mwms-2proc-shm-host", "stratax MultiWorkerMirroredStrategy, 2 processes x 1 "
               "core, shared-memory all-reduce, batches placed from the host "
               "(STRATAX_RESIDENT_ARRAY_BYTES=0)", "stratax", "mwms", processes=2, pin=True,
               transport="shm", resident_arrays=False),
        System("torch-1proc-1core", "PyTorch (eager), 1 process on 1 core", "torch", "none",
               pin=True, note="eager: steps_per_execution does not apply"),
        System("torch-ddp-2proc", "PyTorch DistributedDataParallel (gloo), 2 processes x 1 core",
               "torch", "ddp", processes=2, pin=True,
               note="eager: steps_per_execution does not apply"),
    )
}


@dataclasses.dataclass(frozen=True)
class Config:
    """One cell of a benchmark: a system training a workload with one steps_per_execution."""

    system: str
    workload: str
    spe: int

    @property
    def key(self) -> str:
        """Stable identifier, also used for log and result file names."""
        return f"{self.workload}.spe{self.spe}.{self.system}"


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """A named table: systems x workloads x steps_per_execution, with a stated baseline.

    Example::

        [c.key for c in BENCHMARKS["mirrored"].configs()]
    """

    name: str
    title: str
    systems: tuple[str, ...]
    workloads: tuple[str, ...]
    spes: tuple[int, ...]
    baseline: str
    # (numerator system, denominator system): ratio of median samples/s, per workload and spe.
    pairs: tuple[tuple[str, str], ...] = ()
    device: Device = "cpu"
    # Subsets run by --quick (None: same as the full run), to keep a quick run near 15 min.
    quick_workloads: tuple[str, ...] | None = None
    quick_spes: tuple[int, ...] | None = None
    quick_systems: tuple[str, ...] | None = None
    default: bool = True

    def configs(self, mode: Mode = "full") -> list[Config]:
        """Every configuration of this benchmark, in table order."""
        workloads, spes, systems = self.workloads, self.spes, self.systems
        if mode == "quick":
            workloads = self.quick_workloads or workloads
            spes = self.quick_spes or spes
            systems = self.quick_systems or systems
        return [Config(s, w, spe) for w in workloads for spe in spes for s in systems]


_SINGLE_PROCESS = ("tf-none", "tf-mirrored-1cpu", "tf-mirrored-2lcpu", "kjax-single",
                   "kjax-dp-2dev", "sx-onedevice", "sx-mirrored-1", "sx-mirrored-2dev")
_PAIRS = (
    ("sx-mirrored-1", "tf-mirrored-1cpu"),
    ("sx-mirrored-2dev", "tf-mirrored-2lcpu"),
    ("sx-mirrored-2dev", "kjax-dp-2dev"),
    ("sx-onedevice", "tf-none"),
    ("sx-onedevice", "kjax-single"),
)

BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark("mirrored", "stratax MirroredStrategy vs OneDeviceStrategy vs Keras DataParallel",
                  ("sx-onedevice", "sx-mirrored-1", "sx-mirrored-2dev", "kjax-single",
                   "kjax-dp-2dev", "sx-onedevice-noprefetch", "sx-mirrored-2dev-noprefetch"),
                  ("mlp",), (1, 32), baseline="kjax-single",
                  pairs=(("sx-mirrored-1", "sx-onedevice"), ("sx-mirrored-2dev", "sx-onedevice"),
                         ("sx-mirrored-2dev", "kjax-dp-2dev"), ("sx-onedevice", "kjax-single"),
                         ("sx-onedevice", "sx-onedevice-noprefetch"),
                         ("sx-mirrored-2dev", "sx-mirrored-2dev-noprefetch"))),
        Benchmark("mlp", "MLP 784-128-10, all single-process systems", _SINGLE_PROCESS, ("mlp",),
                  (1, 32), baseline="tf-none", pairs=_PAIRS),
        Benchmark("wide_mlp", "MLP 784-1024-1024-10, all single-process systems", _SINGLE_PROCESS,
                  ("wide_mlp",), (1, 32), baseline="tf-none", pairs=_PAIRS, quick_spes=(32,)),
        Benchmark("cnn", "Small CNN on 32x32x3, all single-process systems", _SINGLE_PROCESS,
                  ("cnn",), (1, 32), baseline="tf-none", pairs=_PAIRS, quick_spes=(1,),
                  quick_systems=("tf-none", "tf-mirrored-1cpu", "kjax-single", "sx-mirrored-1")),
        Benchmark("multiworker", "2 processes x 1 core vs 1 process on 1 core",
                  ("tf-1proc-1core", "tf-mwms-2proc", "tf-mwms-2proc-k3", "sx-1proc-1core",
                   "sx-mwms-2proc", "sx-mwms-2proc-mpi", "sx-mwms-2proc-shm", "torch-1proc-1core",
                   "torch-ddp-2proc"),
                  ("mlp", "wide_mlp"), (1, 32),
                  baseline="tf-1proc-1core",
                  pairs=(("sx-mwms-2proc", "tf-mwms-2proc"), ("sx-1proc-1core", "tf-1proc-1core"),
                         ("tf-mwms-2proc", "tf-1proc-1core"), ("sx-mwms-2proc", "sx-1proc-1core"),
                         ("sx-mwms-2proc-mpi", "sx-1proc-1core"),
                         ("sx-mwms-2proc-mpi", "tf-mwms-2proc"),
                         ("sx-mwms-2proc-shm", "sx-1proc-1core"),
                         ("sx-mwms-2proc-shm", "tf-mwms-2proc"),
                         ("sx-mwms-2proc-shm", "sx-mwms-2proc"),
                         ("sx-mwms-2proc", "torch-ddp-2proc"),
                         ("torch-ddp-2proc", "torch-1proc-1core")),
                  quick_workloads=("mlp", "wide_mlp"), quick_spes=(32,)),
        Benchmark("multiworker_shm", "stratax 2 processes x 1 core: gloo vs shared memory, "
                  "optimizer update sharded vs replicated, arrays kept on the devices vs "
                  "batches placed from the host, against 1 process on 1 core",
                  ("sx-1proc-1core", "sx-mwms-2proc", "sx-mwms-2proc-shm",
                   "sx-mwms-2proc-shm-repl", "sx-1proc-1core-host", "sx-mwms-2proc-shm-host"),
                  ("mlp", "wide_mlp"), (32,), baseline="sx-1proc-1core",
                  pairs=(("sx-mwms-2proc", "sx-1proc-1core"),
                         ("sx-mwms-2proc-shm", "sx-1proc-1core"),
                         ("sx-mwms-2proc-shm-repl", "sx-1proc-1core"),
                         ("sx-mwms-2proc-shm", "sx-mwms-2proc-shm-repl"),
                         ("sx-mwms-2proc-shm", "sx-mwms-2proc"),
                         ("sx-mwms-2proc-shm-host", "sx-1proc-1core-host"),
                         ("sx-mwms-2proc-shm", "sx-mwms-2proc-shm-host"),
                         ("sx-1proc-1core", "sx-1proc-1core-host")),
                  default=False),
        Benchmark("gpu", "One GPU: Keras 3 JAX vs stratax vs TF", ("tf-none", "kjax-single",
                  "sx-mirrored-1"), ("mlp", "cnn"), (1, 32), baseline="tf-none",
                  pairs=(("sx-mirrored-1", "tf-none"), ("sx-mirrored-1", "kjax-single")),
                  device="gpu", default=False, quick_spes=(32,)),
        Benchmark("gpu_resnet50", "One GPU: ResNet-50 on CIFAR-shaped data",
                  ("tf-none", "kjax-single", "sx-mirrored-1"), ("resnet50",), (32,),
                  baseline="tf-none",
                  pairs=(("sx-mirrored-1", "tf-none"), ("sx-mirrored-1", "kjax-single")),
                  device="gpu", default=False),
    )
}
