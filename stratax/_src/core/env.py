"""Every environment variable stratax reads or writes, named in one place.

Resolution order everywhere in stratax: explicit argument, then the environment variable named
here, then auto-detection.
"""

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
# 1); default 120 (parameter_server/tasks/chief_session.py; Server(chief_timeout_seconds=)).
STRATAX_PS_CHIEF_TIMEOUT_SECONDS = "STRATAX_PS_CHIEF_TIMEOUT_SECONDS"
# Largest frame (MiB, default 2048) a ps/worker task receives, and how many local-socket
# connections (and concurrent gRPC calls) it serves (default 256): parameter_server/transport.
STRATAX_PS_MAX_FRAME_MIB = "STRATAX_PS_MAX_FRAME_MIB"
STRATAX_PS_MAX_CONNECTIONS = "STRATAX_PS_MAX_CONNECTIONS"
# Parameter-server transport: "auto" (default: a Unix socket with shared memory to servers on
# the same host, gRPC to the others), "socket" (the same without shared memory) or "grpc"
# (always gRPC); see docs/parameter_server.md, Transport and security.
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
