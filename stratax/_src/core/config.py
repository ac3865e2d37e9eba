"""stratax's tuning options (``sx.config``), each mirrored by a ``STRATAX_*`` variable.

Only tuning knobs are options. Variables that must be set before Python starts, or that are a
contract with a launcher or a cluster (``STRATAX_CPU_DEVICES``, ``STRATAX_TPU_EMULATION``, the
``stratax launch`` process variables, ``STRATAX_RUN_DIR``, ``STRATAX_PS_TOKEN``, ...), stay bare
environment variables, as PyTorch keeps ``NCCL_*``; docs/options.md lists both kinds.

Example::

    import stratax as sx
    sx.config.update("prefetch_depth", 4)      # or STRATAX_PREFETCH_DEPTH=4 in a launch script
    sx.config.prefetch_depth                   # 4
"""

from __future__ import annotations

from stratax._src.core import env
from stratax._src.core.option_registry import (
    Choice,
    ChoiceOrInteger,
    Directory,
    Integer,
    Number,
    Option,
    Options,
)

CPU_COLLECTIVES = ("auto", "gloo", "mpi", "shm")
# Where the caller picks the default (by the devices, the cores, the runner): "decided by use".
_BY_USE = None

config = Options([
    Option("cpu_collectives", env.STRATAX_CPU_COLLECTIVES,
           Choice(CPU_COLLECTIVES, "a CPU collectives implementation"), "auto",
           "Transport between CPU worker processes: 'auto' ('shm' when every process is on one "
           "host with one CPU device and the library builds, else 'gloo'), 'gloo' (TCP), 'shm' "
           "(gloo plus a shared-memory all-reduce; an error where impossible) or 'mpi'. "
           "CommunicationOptions(implementation=...) wins over it."),
    Option("gloo_io_priority", env.STRATAX_GLOO_IO_PRIORITY,
           Choice(("idle", "nice", "normal"), "a priority for gloo's I/O thread"), "idle",
           "Scheduling of gloo's busy-polling I/O thread: 'idle' (SCHED_IDLE), 'nice' "
           "(nice 19) or 'normal'."),
    Option("shm_slot_bytes", env.STRATAX_SHM_SLOT_BYTES,
           Integer(64, "bytes per process slot"), 1 << 20,
           "Bytes of one process's slot in the shared-memory all-reduce (rounded down to a "
           "multiple of 64); larger buffers go through in rounds."),
    Option("shm_spin_us", env.STRATAX_SHM_SPIN_US,
           Number(0, "microseconds a wait spins before it sleeps"), _BY_USE,
           "Microseconds a shared-memory wait spins before it sleeps; default 1 s when every "
           "process has a core of its own, else 50."),
    Option("extension_cache", env.STRATAX_EXTENSION_CACHE,
           Directory("where the compiled shared-memory all-reduce is cached"), _BY_USE,
           "Directory of the compiled shared-memory all-reduce; default "
           "$XDG_CACHE_HOME/stratax/ext (~/.cache)."),
    Option("max_steps_in_flight", env.STRATAX_MAX_STEPS_IN_FLIGHT,
           Integer(0, "steps the host may dispatch ahead; 0 = no bound"), 2,
           "Compiled steps the host may dispatch ahead on several CPU devices of one process."),
    Option("prefetch_depth", env.STRATAX_PREFETCH_DEPTH,
           Integer(0, "batches fit places ahead of the step; 0 = off",
                   unset="for 2 on accelerators, 0 on CPU"), _BY_USE,
           "Batches fit places on the devices ahead of the step; default 2 on accelerators, "
           "0 on CPU."),
    Option("resident_array_bytes", env.STRATAX_RESIDENT_ARRAY_BYTES,
           Integer(0, "bytes of fit's array input kept on the devices; 0 = off"), _BY_USE,
           "Most bytes of fit's array input kept on each device (batches are then gathered "
           "inside the step); default 1 GiB on CPU, 0 on accelerators."),
    Option("sharded_update", env.STRATAX_SHARDED_UPDATE,
           Choice(("auto", "off"), "a sharded-update setting"), "auto",
           "'auto' shards fit's optimizer update over the processes where it computes the "
           "same update (ZeRO stage 1); 'off' keeps it replicated."),
    Option("ps_transport", env.STRATAX_PS_TRANSPORT,
           Choice(("auto", "socket", "tcp", "grpc"),
                  "a parameter-server transport ('auto': a Unix socket and shared memory to "
                  "servers on the same host, sealed TCP to the others; 'socket': the same "
                  "without shared memory; 'tcp': sealed TCP to every server; 'grpc': always "
                  "gRPC)"), "auto",
           "Parameter-server calls: 'auto' (a Unix socket with shared memory to servers on the "
           "same host, sealed TCP to others), 'socket' (without shared memory), 'tcp' (sealed "
           "TCP to all) or 'grpc'."),
    Option("ps_snapshot_dir", env.STRATAX_PS_SNAPSHOT_DIR,
           Directory("where each parameter server writes its snapshots"), _BY_USE,
           "Directory where each parameter server writes ps<index>.npz and reloads it on "
           "restart; unset: no snapshots."),
    Option("ps_snapshot_every", env.STRATAX_PS_SNAPSHOT_EVERY,
           Integer(1, "pushes between snapshots"), 100,
           "Pushes between a parameter server's snapshots."),
    Option("ps_dense_variables", env.STRATAX_PS_DENSE_VARIABLES,
           Choice(("ps", "workers"), "a ParameterServerStrategy placement"), "ps",
           "Where ParameterServerStrategy keeps the variables no step reads row-sparse: 'ps', "
           "or 'workers' (hybrid mode); its dense_variables argument wins."),
    Option("ps_max_staleness", env.STRATAX_PS_MAX_STALENESS,
           Integer(0, "steps a row update may lag"), 0,
           "Hybrid mode with mode='async': steps a worker's row updates may lag its reads; "
           "ParameterServerStrategy(max_staleness=) wins."),
    Option("ps_build_on_servers_bytes", env.STRATAX_PS_BUILD_ON_SERVERS_BYTES,
           Integer(0, "bytes from which a Keras variable is built on its servers; 0 = never"),
           64 << 20,
           "ParameterServerStrategy: Keras variables of at least this many bytes whose "
           "initializer is a Keras built-in are built by their parameter servers, shard by "
           "shard, never whole on the chief; 0 builds every variable on the chief."),
    Option("ps_progress_seconds", env.STRATAX_PS_PROGRESS_SECONDS,
           Number(0, "seconds between progress lines; 0 = off"), 10.0,
           "Seconds between the ClusterCoordinator's progress lines; 0 turns them off."),
    Option("ps_chief_timeout_seconds", env.STRATAX_PS_CHIEF_TIMEOUT_SECONDS,
           Number(3, "seconds a served task waits for a chief"), 120.0,
           "Seconds a served ps/worker task waits without a chief before it exits."),
    Option("ps_max_frame_mib", env.STRATAX_PS_MAX_FRAME_MIB,
           Integer(1, "MiB of the largest frame a parameter-server task takes"), 2048,
           "Largest frame (MiB) a ps/worker task receives; a larger one is refused before "
           "anything is allocated for it."),
    Option("ps_max_connections", env.STRATAX_PS_MAX_CONNECTIONS,
           Integer(1, "connections (and concurrent gRPC calls) one parameter-server task "
                      "serves"), 256,
           "Local-socket connections, and concurrent gRPC calls, one ps/worker task serves; "
           "more are refused."),
    Option("ps_worker_threads", env.STRATAX_PS_WORKER_THREADS,
           ChoiceOrInteger(Choice(("auto", "all"), "a thread setting"),
                           Integer(1, "XLA threads per worker, or 'all' for XLA's default",
                                   unset="for 'auto' (the host's cores shared among its worker "
                                         "tasks)")), "auto",
           "XLA threads of a parameter-server worker task: 'auto' (the host's cores shared "
           "among its worker tasks), 'all' (one per core) or a number; read before the "
           "worker's JAX starts."),
])
