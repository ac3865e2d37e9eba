"""Every environment variable stratax reads or writes: its name, and how its value is read.

Resolution order everywhere in stratax: explicit argument, then the environment variable named
here, then auto-detection.

Every ``STRATAX_*`` setting (and every cluster variable a resolver reads) is read through the
functions below, so a bad value reads the same everywhere, e.g.::

    Environment variable STRATAX_SHM_SLOT_BYTES='12x' is not an integer >= 64 (bytes per
    process slot); set it to an integer >= 64 or unset it for the default 1048576.

An unset variable and an empty one are the same.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

# Keras / JAX start-up.
KERAS_BACKEND = "KERAS_BACKEND"
XLA_FLAGS = "XLA_FLAGS"
# Number of forced CPU replicas (``--xla_force_host_platform_device_count``) set by stratax helpers.
STRATAX_CPU_DEVICES = "STRATAX_CPU_DEVICES"

# Level of the stderr handler stratax attaches to its "stratax" logger (debug, info, warning,
# error); unset: stratax configures no logging (stratax._src.core.logs). `stratax --log-level`
# sets it for the processes it starts.
STRATAX_LOG_LEVEL = "STRATAX_LOG_LEVEL"

# Cluster membership.
TF_CONFIG = "TF_CONFIG"

# Process-group contract written by ``stratax launch`` for each child (read by the resolvers).
# "host:port" of the jax.distributed coordinator (the process with global rank 0).
STRATAX_COORDINATOR_ADDRESS = "STRATAX_COORDINATOR_ADDRESS"
# Total number of processes in the job (all nodes).
STRATAX_NUM_PROCESSES = "STRATAX_NUM_PROCESSES"
# Global rank of this process, 0 .. STRATAX_NUM_PROCESSES - 1.
STRATAX_PROCESS_ID = "STRATAX_PROCESS_ID"
# Rank of this process among the processes of its node.
STRATAX_LOCAL_RANK = "STRATAX_LOCAL_RANK"
# 0 on first start, k after k restarts of the whole process group by ``stratax launch``.
STRATAX_RESTART_COUNT = "STRATAX_RESTART_COUNT"
# Set to 1 by ``stratax launch`` so children's output reaches the launcher line by line.
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"

# torchrun, Kubeflow PyTorchJob and TorchX (read by TorchrunClusterResolver). torchrun sets all
# of them for each child; a PyTorchJob sets all but the LOCAL_* ones in each pod.
# "host" and port of torch's rendezvous store, held by global rank 0's node (or its agent).
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
# Processes in the job, this process' global rank, and its rank and count on its node.
WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"

# MPI launchers (read by MPIClusterResolver). Open MPI's mpirun/mpiexec/prterun set OMPI_*;
# MPICH's and Intel MPI's mpiexec (Hydra) and `srun --mpi=pmi2` set PMI_*; PMIx launchers
# (`srun --mpi=pmix`, Open MPI 5) set PMIX_RANK. Names as JAX's
# jax/_src/clusters/ompi_cluster.py reads them.
OMPI_COMM_WORLD_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_COMM_WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_COMM_WORLD_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
# URI of Open MPI (<= 4)'s mpirun daemon: "<jobid>.<vpid>;tcp://ip[,ip...]:port".
OMPI_MCA_ORTE_HNP_URI = "OMPI_MCA_orte_hnp_uri"
PMI_RANK = "PMI_RANK"
PMI_SIZE = "PMI_SIZE"
PMIX_RANK = "PMIX_RANK"
# This process' rank on its node, set by Hydra's mpiexec (MPICH, Intel MPI) and not by srun.
MPI_LOCALRANKID = "MPI_LOCALRANKID"

# JAX's own job description (read by JAXClusterResolver). JAX_COORDINATOR_ADDRESS and
# JAX_COORDINATOR_PORT are the variables jax.distributed.initialize() itself reads: the
# coordinator's "host:port", and the port that replaces one derived from the cluster. The
# torchrun and MPI resolvers honour both. JAX_NUM_PROCESSES / JAX_PROCESS_ID carry the
# arguments of the same names, as job scripts for jax.distributed commonly export them.
JAX_COORDINATOR_ADDRESS = "JAX_COORDINATOR_ADDRESS"
JAX_COORDINATOR_PORT = "JAX_COORDINATOR_PORT"
JAX_NUM_PROCESSES = "JAX_NUM_PROCESSES"
JAX_PROCESS_ID = "JAX_PROCESS_ID"

# Slurm (set by srun / sbatch; read by SlurmClusterResolver). STEP_* values describe the current
# srun step and win over the allocation-wide ones.
SLURM_PROCID = "SLURM_PROCID"
SLURM_NTASKS = "SLURM_NTASKS"
SLURM_STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
SLURM_JOB_NODELIST = "SLURM_JOB_NODELIST"
SLURM_STEP_NODELIST = "SLURM_STEP_NODELIST"
SLURM_TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
SLURM_STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"
SLURM_LOCALID = "SLURM_LOCALID"
SLURM_GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"
SLURM_GPUS_PER_TASK = "SLURM_GPUS_PER_TASK"
# GPUs visible to this process; SlurmClusterResolver(auto_set_gpu=True) writes it.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

# Kubernetes Indexed Job (read by KubernetesClusterResolver). Kubernetes sets the first two; the
# pod spec sets the STRATAX_K8S_* ones (see the resolver's docstring for a pod-spec example).
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
HOSTNAME = "HOSTNAME"
# Number of pods of the Indexed Job (= .spec.completions); its presence opts in to detection.
STRATAX_K8S_NUM_WORKERS = "STRATAX_K8S_NUM_WORKERS"
# Name of the headless Service that is the pods' subdomain (.spec.template.spec.subdomain).
STRATAX_K8S_SERVICE = "STRATAX_K8S_SERVICE"
# Name of the Job; defaults to $HOSTNAME without its "-<index>" suffix.
STRATAX_K8S_JOB_NAME = "STRATAX_K8S_JOB_NAME"
# Port every pod's task listens on (default 8888).
STRATAX_K8S_PORT = "STRATAX_K8S_PORT"
# How many compiled steps the host may dispatch ahead on multi-device CPU (0 = unbounded).
STRATAX_MAX_STEPS_IN_FLIGHT = "STRATAX_MAX_STEPS_IN_FLIGHT"
# Run directory of an observed run (``stratax launch --dashboard``, ``sx.observe``): each process
# appends its metrics to <dir>/metrics/<task>.jsonl and the launcher its events to
# <dir>/events.jsonl.
STRATAX_RUN_DIR = "STRATAX_RUN_DIR"
# Name of this process in the run directory (e.g. "worker_1", "ps_0"); default: from the rank.
STRATAX_TASK_NAME = "STRATAX_TASK_NAME"
# Token a non-loopback dashboard requires (generated and printed when unset).
STRATAX_DASHBOARD_TOKEN = "STRATAX_DASHBOARD_TOKEN"
# Set to 1 to run with Keras/JAX versions outside the tested range (stratax._src.seam).
STRATAX_SKIP_VERSION_CHECK = "STRATAX_SKIP_VERSION_CHECK"
# How many batches fit places on the devices ahead of the step (default 2, 0 = off).
STRATAX_PREFETCH_DEPTH = "STRATAX_PREFETCH_DEPTH"
# The most bytes of fit's array input kept on a process's devices (per device; 0 = off;
# default 1 GiB on CPU, 0 on accelerators): batches are then gathered inside the step.
STRATAX_RESIDENT_ARRAY_BYTES = "STRATAX_RESIDENT_ARRAY_BYTES"

# Cloud TPU VM / GKE TPU / Colab (read by TPUClusterResolver; set by the TPU runtime, libtpu or
# the TPU VM's tpu-env metadata). Names as JAX's jax/_src/clusters/cloud_tpu_cluster.py reads them.
TPU_NAME = "TPU_NAME"
TPU_WORKER_ID = "TPU_WORKER_ID"
TPU_WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"
TPU_PROCESS_ADDRESSES = "TPU_PROCESS_ADDRESSES"
TPU_ACCELERATOR_TYPE = "TPU_ACCELERATOR_TYPE"
TPU_PROCESS_BOUNDS = "TPU_PROCESS_BOUNDS"
TPU_CHIPS_PER_PROCESS_BOUNDS = "TPU_CHIPS_PER_PROCESS_BOUNDS"
MEGASCALE_COORDINATOR_ADDRESS = "MEGASCALE_COORDINATOR_ADDRESS"
MEGASCALE_NUM_SLICES = "MEGASCALE_NUM_SLICES"
MEGASCALE_SLICE_ID = "MEGASCALE_SLICE_ID"
# Set by Colab: the address of a legacy (remote, gRPC) Colab TPU, which JAX cannot use.
COLAB_TPU_ADDR = "COLAB_TPU_ADDR"
# Opt-in TPU emulation: N CPU devices act as the TPU cores of TPUStrategy (testing only).
STRATAX_TPU_EMULATION = "STRATAX_TPU_EMULATION"
# Shared secret every parameter-server / worker call must carry (required off loopback).
STRATAX_PS_TOKEN = "STRATAX_PS_TOKEN"
# Path of a file holding that secret (read when STRATAX_PS_TOKEN is unset).
STRATAX_PS_TOKEN_FILE = "STRATAX_PS_TOKEN_FILE"
# "W,P" set by `stratax launch --workers W --ps P`: children get chief/worker/ps TF_CONFIG.
STRATAX_PS_ROLES = "STRATAX_PS_ROLES"

# CPU collectives between worker processes (docs/transport.md): "auto" (default: "shm" when
# every process is on one host with one CPU device and the library builds, else "gloo"),
# "gloo" (TCP), "shm" (gloo plus a shared-memory all-reduce; an error where impossible) or
# "mpi" (JAX's MPI collectives through MPItrampoline).
STRATAX_CPU_COLLECTIVES = "STRATAX_CPU_COLLECTIVES"
# Scheduling of gloo's busy-polling I/O thread: "idle" (default: SCHED_IDLE, so it never delays
# the thread a collective waits for), "nice" (nice 19) or "normal" (stratax._src.runtime.gloo_io).
STRATAX_GLOO_IO_PRIORITY = "STRATAX_GLOO_IO_PRIORITY"
# Parameter-server snapshots (docs/parameter_server.md, Failures): a directory where each ps
# writes `ps<index>.npz` every STRATAX_PS_SNAPSHOT_EVERY pushes, and reloads it on restart.
STRATAX_PS_SNAPSHOT_DIR = "STRATAX_PS_SNAPSHOT_DIR"
STRATAX_PS_SNAPSHOT_EVERY = "STRATAX_PS_SNAPSHOT_EVERY"
# Seconds between the ClusterCoordinator's progress lines (per-worker steps/s, the slowest
# worker); default 10, 0 turns them off (stratax._src.parameter_server.progress).
STRATAX_PS_PROGRESS_SECONDS = "STRATAX_PS_PROGRESS_SECONDS"
# ParameterServerStrategy's hybrid mode (options ps_dense_variables, ps_max_staleness).
STRATAX_PS_DENSE_VARIABLES = "STRATAX_PS_DENSE_VARIABLES"
STRATAX_PS_MAX_STALENESS = "STRATAX_PS_MAX_STALENESS"
# Bytes from which ParameterServerStrategy builds a Keras variable on its parameter servers,
# shard by shard, instead of on the chief (option ps_build_on_servers_bytes; 0 = never).
STRATAX_PS_BUILD_ON_SERVERS_BYTES = "STRATAX_PS_BUILD_ON_SERVERS_BYTES"
# Seconds a served ps/worker task waits without hearing from a chief before it exits (status
# 1); default 120 (parameter_server/tasks/ownership.py; Server(chief_timeout_seconds=)).
STRATAX_PS_CHIEF_TIMEOUT_SECONDS = "STRATAX_PS_CHIEF_TIMEOUT_SECONDS"
# Largest frame (MiB, default 2048) a ps/worker task receives, and how many local-socket
# connections (and concurrent gRPC calls) it serves (default 256): parameter_server/transport.
STRATAX_PS_MAX_FRAME_MIB = "STRATAX_PS_MAX_FRAME_MIB"
STRATAX_PS_MAX_CONNECTIONS = "STRATAX_PS_MAX_CONNECTIONS"
# Parameter-server transport: "auto" (default: a Unix socket with shared memory to servers on
# the same host, sealed TCP to the others), "socket" (the same without shared memory), "tcp"
# (sealed TCP to every server) or "grpc" (always gRPC); see docs/parameter_server.md,
# Transport and security.
STRATAX_PS_TRANSPORT = "STRATAX_PS_TRANSPORT"

# STRATAX_CPU_COLLECTIVES=shm/auto (docs/transport.md): where the compiled shared-memory all-reduce
# library is cached (default ~/.cache/stratax/ext), and the bytes of one rank's slot.
STRATAX_EXTENSION_CACHE = "STRATAX_EXTENSION_CACHE"
STRATAX_SHM_SLOT_BYTES = "STRATAX_SHM_SLOT_BYTES"
# Microseconds a shared-memory all-reduce spins for its peers before sleeping (default 1 s
# when every process has a core of its own, else 50).
STRATAX_SHM_SPIN_US = "STRATAX_SHM_SPIN_US"
# "off" keeps fit's optimizer update replicated on every process; "auto" (default) shards it
# over the processes where it can (stratax._src.keras.steps.sharded_update).
STRATAX_SHARDED_UPDATE = "STRATAX_SHARDED_UPDATE"
# XLA threads of a parameter-server worker task: "auto" (default: the host's cores shared among
# the worker tasks on it), "all" (XLA's default, one per core) or a number; see
# stratax._src.parameter_server.tasks.compute_threads.
STRATAX_PS_WORKER_THREADS = "STRATAX_PS_WORKER_THREADS"


_Number = TypeVar("_Number", int, float)


def get_str(name: str, context: str) -> str:
    """Returns the non-empty value of environment variable ``name``.

    Args:
      name: The variable.
      context: Who needs it and how to set it, appended to the error message.

    Raises:
      ValueError: If the variable is unset or empty.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        raise ValueError(f"Environment variable {name} is not set (or empty); {context}")
    return value


def get_choice(name: str, choices: tuple[str, ...], default: str, *, what: str) -> str:
    """The value of ``name``, case and surrounding spaces ignored, or ``default`` when unset.

    Raises:
      ValueError: a value outside ``choices``; the message says it is not ``what`` (e.g. "a
        CPU collectives implementation") and lists the choices.
    """
    value = os.environ.get(name, "").strip().lower() or default
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not {what}; use one of {', '.join(choices)} "
                         f"(or unset it for {default}).")
    return value


def _parse(convert: Callable[[str], _Number], kind: str, name: str, value: str,
           minimum: _Number, default: _Number | None, meaning: str, unset: str) -> _Number:
    """``convert(value)`` if it is ``>= minimum``, ``default`` if ``value`` is empty and there
    is one, else the one error, worded by ``kind`` ("an integer", "a number")."""
    text = value.strip()
    if not text and default is not None:
        return default
    try:
        number = convert(text)
    except ValueError:
        number = None
    if number is not None and number >= minimum:  # False for NaN too
        return number
    expected = f"{kind} >= {_show(minimum)}"
    if default is not None:
        fix = f" or unset it for the default {_show(default)}"
    elif unset:
        fix = f" or unset it {unset}"
    else:
        fix = f", e.g. {name}={_show(max(minimum, 1))}"
    what = f" ({meaning})" if meaning else ""
    raise ValueError(f"Environment variable {name}={value!r} is not {expected}{what}; "
                     f"set it to {expected}{fix}.")


def _show(number: float) -> str:
    return f"{number:g}" if isinstance(number, float) else str(number)


def parse_int(name: str, value: str, minimum: int = 0, *, default: int | None = None,
              meaning: str = "", unset: str = "") -> int:
    """Parses the value of environment variable ``name`` as an integer ``>= minimum``.

    Args:
      name: The variable, named in the error.
      value: Its raw value (``""`` when unset).
      minimum: The smallest value accepted.
      default: Returned when ``value`` is empty; the error offers it ("or unset it for the
        default 2").
      meaning: What the number counts, shown in the error ("bytes per process slot").
      unset: For a variable without a plain default, what unsetting it does, shown in the error
        instead of a default ("for one CPU device"; ``get_optional_int`` returns ``None``).

    Raises:
      ValueError: ``value`` is not a decimal integer ``>= minimum`` (an empty one neither,
        unless there is a ``default``).
    """
    return _parse(int, "an integer", name, value, minimum, default, meaning, unset)


def get_int(name: str, context: str, minimum: int = 0) -> int:
    """Returns required environment variable ``name`` as an integer ``>= minimum``; see
    ``get_str`` for ``context``."""
    return parse_int(name, get_str(name, context), minimum)


def get_optional_int(name: str, minimum: int = 0, *, meaning: str = "",
                     unset: str = "") -> int | None:
    """Environment variable ``name`` as an integer ``>= minimum``, or ``None`` when it is unset
    or empty; ``meaning`` and ``unset`` word the error as in ``parse_int``."""
    value = os.environ.get(name, "")
    if not value.strip():
        return None
    return parse_int(name, value, minimum, meaning=meaning, unset=unset)


def get_int_or(name: str, default: int, minimum: int = 0, *, meaning: str = "") -> int:
    """Environment variable ``name`` as an integer ``>= minimum``, or ``default`` when it is
    unset or empty; see ``parse_int``."""
    return parse_int(name, os.environ.get(name, ""), minimum, default=default, meaning=meaning)


def get_float_or(name: str, default: float, minimum: float = 0, *, meaning: str = "") -> float:
    """Environment variable ``name`` as a number ``>= minimum`` (not NaN), or ``default`` when it
    is unset or empty; the error reads like ``parse_int``'s, with "a number" for "an integer"."""
    return _parse(float, "a number", name, os.environ.get(name, ""), float(minimum), default,
                  meaning, "")
