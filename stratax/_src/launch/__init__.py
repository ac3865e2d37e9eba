"""Local multi-process launcher behind ``stratax launch`` (like torchrun).

It starts ``nproc_per_node`` workers with the environment a MultiWorkerMirroredStrategy reads
(``STRATAX_*`` and, on one node, ``TF_CONFIG``), prefixes their output with ``[worker i]``,
tears the group down when one fails, restarts it up to ``max_restarts`` times, and enforces an
optional wall-clock timeout. Across hosts, ``--nnodes MIN:MAX --rdzv-endpoint HOST:PORT`` makes
the nodes elastic through a rendezvous store in one launcher (``rounds``, ``rendezvous``,
``node_agent``).

Entry points: :func:`launch` (programmatic), :func:`add_launch_arguments` and
:func:`run_launch` (for the ``stratax`` CLI), and ``python -m stratax._src.launch``.
"""

from stratax._src.launch.arguments import (
    add_launch_arguments,
    build_parser,
    command_from_args,
    python_command,
    run_launch,
)
from stratax._src.launch.child_env import WorkerSpec, build_worker_specs, tf_config_json
from stratax._src.launch.config import Address, LaunchConfig, LaunchError, parse_address
from stratax._src.launch.entry import launch
from stratax._src.launch.outcome import EXIT_TIMEOUT, LaunchResult, TaskFailure

__all__ = [
    "EXIT_TIMEOUT",
    "Address",
    "LaunchConfig",
    "LaunchError",
    "LaunchResult",
    "TaskFailure",
    "WorkerSpec",
    "add_launch_arguments",
    "build_parser",
    "build_worker_specs",
    "command_from_args",
    "launch",
    "parse_address",
    "python_command",
    "run_launch",
    "tf_config_json",
]
