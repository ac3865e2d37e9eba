"""Command-line front end of the launcher: the flags of ``stratax launch`` and their runner.

``stratax/_src/cli.py`` adds these flags to its ``launch`` sub-command and calls
:func:`run_launch`; ``python -m stratax._src.launch`` does the same without the CLI.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Sequence

from stratax._src.core import env as env_names
from stratax._src.launch.config import LaunchError, parse_nproc
from stratax._src.launch.entry import launch
from stratax._src.observe.arguments import add_dashboard_arguments, dashboard_from_args

EXIT_USAGE = 2  # argparse's code for a bad command line


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``stratax launch`` flags and the program positionals to ``parser``.

    Usage: ``[--nproc-per-node N|MIN:MAX] [--nnodes M --node-rank R --coordinator host:port |
    --nnodes MIN:MAX --rdzv-endpoint host:port]
    [--max-restarts K] [--timeout S] [--log-dir DIR] [-m] program [args...]``. Everything after
    the program belongs to it; ``--`` may separate launcher flags from the program.
    """
    parser.add_argument("--nproc-per-node", "--nproc_per_node", default=1, metavar="N|MIN:MAX",
                        action=_WorkerRange,
                        help="worker processes on this node (default: 1); MIN:MAX is elastic: "
                             "a worker that fails past --max-restarts is dropped and the group "
                             "goes on with the rest from its last backup, down to MIN")
    parser.add_argument("--nnodes", default=1, metavar="M|MIN:MAX", action=_NodeRange,
                        help="nodes in the job, one launcher per node (default: 1); MIN:MAX "
                             "(with --rdzv-endpoint) is elastic: a lost node is dropped and "
                             "an arriving one admitted at a new round, from the last backup")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, metavar="R",
                        help="index of this node, 0..M-1; node 0 hosts the coordinator")
    parser.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                        help="jax.distributed coordinator address (global rank 0). Default on "
                             "one node: 127.0.0.1 and a free port; required with --nnodes > 1 "
                             "(an elastic job's rounds pick their own)")
    parser.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default=None,
                        metavar="HOST:PORT",
                        help="rendezvous store of an elastic job across hosts: an address of "
                             "one node, whose launcher hosts the store; the same on every node, "
                             "with the same STRATAX_PS_TOKEN")
    parser.add_argument("--rdzv-last-call", type=float, default=3.0, metavar="SECONDS",
                        help="a round with at least MIN nodes waits this long for more "
                             "(default: 3)")
    parser.add_argument("--rdzv-heartbeat-timeout", type=float, default=15.0,
                        metavar="SECONDS",
                        help="a node silent this long is dropped and a new round starts "
                             "(default: 15)")
    parser.add_argument("--max-restarts", "--max_restarts", type=int, default=0, metavar="K",
                        help="restart the whole group up to K times after a worker fails; "
                             "with --ps, a failed worker or ps task is restarted alone (up to "
                             "K times) and rejoins the running chief")
    parser.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                        help="wall-clock limit for the whole launch, restarts included")
    parser.add_argument("--grace-period", type=float, default=5.0, metavar="SECONDS",
                        help="seconds between SIGTERM and SIGKILL when stopping workers "
                             "(default: 5)")
    parser.add_argument("--coordinator-wait", type=float, default=120.0, metavar="SECONDS",
                        help="how long a node with --node-rank > 0 retries reaching the "
                             "coordinator (with --rdzv-endpoint: the store, and a round of MIN "
                             "nodes) before giving up (default: 120)")
    parser.add_argument("--log-dir", default=None, metavar="DIR",
                        help="also append each task's output to DIR/<task>.log (worker_1.log; "
                             "chief_0.log, ps_2.log under --workers/--ps)")
    add_dashboard_arguments(parser)
    parser.add_argument("--workers", type=int, default=None, metavar="W",
                        help="ParameterServerStrategy cluster: W worker tasks (with --ps; starts "
                             "1 chief + W workers + P ps, each with its chief/worker/ps TF_CONFIG)")
    parser.add_argument("--ps", type=int, default=None, metavar="P",
                        help="ParameterServerStrategy cluster: P parameter-server tasks")
    parser.add_argument("-m", "--module", action="store_true",
                        help="run program as a module: python -m program (like python -m)")
    parser.add_argument("program", help="the script (or, with -m, module) every worker runs")
    parser.add_argument("program_args", nargs=argparse.REMAINDER,
                        help="arguments passed to the program")


class _WorkerRange(argparse.Action):
    """``--nproc-per-node N`` or ``MIN:MAX``: sets ``nproc_per_node`` (the maximum) and
    ``min_nproc_per_node`` (``None`` unless elastic)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        try:
            minimum, maximum = parse_nproc(str(values))
        except ValueError as err:
            raise argparse.ArgumentError(self, str(err)) from None
        namespace.nproc_per_node, namespace.min_nproc_per_node = maximum, minimum


class _NodeRange(argparse.Action):
    """``--nnodes N`` or ``MIN:MAX``: sets ``nnodes`` (the maximum) and ``min_nnodes``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        try:
            minimum, maximum = parse_nproc(str(values), "--nnodes")
        except ValueError as err:
            raise argparse.ArgumentError(self, str(err)) from None
        namespace.nnodes, namespace.min_nnodes = maximum, minimum


def python_command(program: str, args: Sequence[str] = (), *, module: bool = False) -> list[str]:
    """``[sys.executable, program, *args]`` or ``[sys.executable, "-m", program, *args]``.

    Raises:
        ValueError: when ``program`` is a script path that does not exist.
    """
    if module:
        return [sys.executable, "-m", program, *args]
    if not os.path.isfile(program):
        raise ValueError(
            f"Script {program!r} not found (working directory {os.getcwd()!r}); pass the path of "
            f"an existing Python file, or use -m {program} to run a module."
        )
    return [sys.executable, program, *args]


def command_from_args(args: argparse.Namespace) -> list[str]:
    """The worker command for parsed ``stratax launch`` arguments.

    A leading ``--`` before the program's arguments is dropped (argparse keeps it in some
    Python versions), so ``stratax launch train.py -- --lr 1`` passes ``--lr 1``.

    Raises:
        ValueError: when the script does not exist.
    """
    program_args = list(args.program_args)
    if program_args[:1] == ["--"]:
        program_args = program_args[1:]
    return python_command(args.program, program_args, module=args.module)


def run_launch(args: argparse.Namespace) -> int:
    """Runs ``stratax launch`` from parsed arguments; returns the process exit code.

    Prints the root-cause summary to stderr when the group fails, times out or is interrupted;
    a bad command line or a start-up problem prints one ``error:`` line and returns 2 or 1.
    With ``--dashboard`` (or ``--run-dir``) the run is observed: see ``stratax._src.observe``.
    """
    try:
        with dashboard_from_args(args, "stratax launch") as run_dir:
            return _run_launch(args, None if run_dir is None else str(run_dir))
    except ValueError as err:  # the dashboard could not start
        _print_error(str(err))
        return EXIT_USAGE


def _run_launch(args: argparse.Namespace, run_dir: str | None) -> int:
    try:
        cmd = command_from_args(args)
        nproc_per_node, extra_env = parameter_server_layout(args)
        result = launch(
            cmd,
            nproc_per_node=nproc_per_node,
            min_nproc_per_node=getattr(args, "min_nproc_per_node", None),
            env=extra_env,
            nnodes=args.nnodes,
            min_nnodes=getattr(args, "min_nnodes", None),
            node_rank=args.node_rank,
            coordinator=args.coordinator,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_last_call=args.rdzv_last_call,
            rdzv_heartbeat_timeout=args.rdzv_heartbeat_timeout,
            max_restarts=args.max_restarts,
            timeout=args.timeout,
            grace_period=args.grace_period,
            coordinator_wait=args.coordinator_wait,
            log_dir=args.log_dir,
            handle_signals=True,
            run_dir=run_dir,
        )
    except (ValueError, TypeError) as err:
        _print_error(str(err))
        return EXIT_USAGE
    except LaunchError as err:
        _print_error(str(err))
        return 1
    if not result.ok:
        print(result.summary, file=sys.stderr, flush=True)
    return result.exit_code


def parameter_server_layout(args: argparse.Namespace) -> tuple[int, dict[str, str]]:
    """``(processes on this node, extra environment)`` for ``--workers W --ps P``.

    Raises:
        ValueError: only one of the two flags, a count below 1, or combined with
            ``--nproc-per-node``/``--nnodes``.
    """
    workers, ps = getattr(args, "workers", None), getattr(args, "ps", None)
    if workers is None and ps is None:
        return args.nproc_per_node, {}
    if workers is None or ps is None or workers < 1 or ps < 1:
        raise ValueError(f"--workers and --ps go together, each at least 1 (got --workers "
                         f"{workers} --ps {ps}); e.g. "
                         "`stratax launch --workers 2 --ps 1 train.py`.")
    if (args.nproc_per_node != 1 or getattr(args, "min_nproc_per_node", None) is not None
            or args.nnodes != 1):
        raise ValueError("--workers/--ps start a one-node cluster of 1 + W + P processes (a "
                         "failed worker or ps task rejoins the running chief); drop "
                         "--nproc-per-node and --nnodes.")
    extra = {env_names.STRATAX_PS_ROLES: f"{workers},{ps}"}
    if not (os.environ.get(env_names.STRATAX_PS_TOKEN)
            or os.environ.get(env_names.STRATAX_PS_TOKEN_FILE)):
        # A secret for this run's tasks only: their gRPC calls carry it (the local socket
        # checks the caller's uid instead). A token the user set is kept (several runs, or
        # tasks started by hand, may share it).
        extra[env_names.STRATAX_PS_TOKEN] = secrets.token_urlsafe(32)
    return 1 + workers + ps, extra


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """A stand-alone parser with the launch flags (used by ``python -m stratax._src.launch``)."""
    parser = argparse.ArgumentParser(
        prog=prog or "stratax launch",
        description="Run a program as a local group of worker processes (like torchrun), "
                    "with the STRATAX_* / TF_CONFIG environment a MultiWorkerMirroredStrategy "
                    "reads.",
    )
    add_launch_arguments(parser)
    return parser


def _print_error(message: str) -> None:
    print(f"stratax launch: error: {message}", file=sys.stderr, flush=True)
