"""The ``stratax`` command: ``stratax train`` (the main job) and ``stratax launch``.

``stratax train`` trains a classifier on the digits embedded in the package, with a strategy
over the local devices (no network needed)::

    stratax train                                   # MirroredStrategy over all local devices
    stratax train --devices 2 --model cnn           # split the CPU into 2 replicas first
    stratax train --strategy one_device --epochs 5 --min-accuracy 0.9

``stratax launch`` runs a program as a local group of worker processes (like torchrun)::

    stratax launch --nproc-per-node 2 examples/multi_worker_keras.py

``stratax dashboard RUN_DIR`` serves the web dashboard of a run (``--dashboard`` on ``launch``
and ``train`` serves it live).
``stratax server`` runs a generic parameter-server or worker task (from TF_CONFIG) for a
``ParameterServerStrategy`` chief.

The parser is built, and the arguments checked, before anything queries JAX's devices, so
``--devices`` can still split the CPU. This module itself imports neither JAX nor Keras; the
strategy registry is imported only for ``train``, the Keras runner only once training starts.
(Importing any ``stratax.*`` module still runs ``stratax/__init__.py``, which imports both.)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from stratax._src.core import env, logs
from stratax._src.launch.arguments import add_launch_arguments, run_launch
from stratax._src.observe.arguments import add_dashboard_command
from stratax._src.train.arguments import DESCRIPTION as TRAIN_DESCRIPTION
from stratax._src.train.arguments import add_train_arguments, run_train

PROG = "stratax"


class _SubcommandParser(argparse.ArgumentParser):
    """A sub-command's parser that rejects unknown flags itself.

    argparse hands a sub-parser's leftovers back to the top-level parser, whose error prints
    ``stratax``'s usage; a user who mistyped a ``train`` flag needs ``train``'s usage.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser(strategy_names: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``stratax`` parser with its ``train`` and ``launch`` sub-commands.

    Args:
        strategy_names: the ``--strategy`` choices of ``train``; ``None`` defers the check of
            the name to the strategy registry when training starts.
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="tf.distribute strategies on JAX, with Keras 3 as the model API.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--log-level", choices=logs.LEVELS, default=None,
                        help="show stratax's log records at this level and above on stderr, "
                             "here and in the processes `launch` starts (sets "
                             f"{env.STRATAX_LOG_LEVEL}); default: warnings and errors only")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     parser_class=_SubcommandParser)
    train = commands.add_parser(
        "train", help="train a digits classifier with a strategy (no network needed)",
        description=TRAIN_DESCRIPTION,
    )
    add_train_arguments(train, strategy_names)
    train.set_defaults(handler=run_train)
    launch = commands.add_parser(
        "launch", help="run a program as a local group of worker processes (like torchrun)",
        description="Run a program as a local group of worker processes (like torchrun), with "
                    "the STRATAX_* / TF_CONFIG environment a MultiWorkerMirroredStrategy reads.",
    )
    add_launch_arguments(launch)
    launch.set_defaults(handler=run_launch)
    add_dashboard_command(commands)
    server = commands.add_parser(
        "server", help="run this task's parameter server or worker (reads TF_CONFIG)",
        description="Serve the 'ps' or 'worker' task named by TF_CONFIG (or --job/--index) for a "
                    "ParameterServerStrategy chief; exits when the chief is done.",
    )
    server.add_argument("--job", choices=("ps", "worker"), default=None,
                        help="task type (default: TF_CONFIG's task.type)")
    server.add_argument("--index", type=int, default=None,
                        help="task index (default: TF_CONFIG's task.index)")
    server.set_defaults(handler=_run_server)
    return parser


def _run_server(args: argparse.Namespace) -> int:
    # Imported here: only `server` needs gRPC.
    from stratax._src.cluster.tfconfig import TFConfigClusterResolver
    from stratax._src.parameter_server.tasks import compute_threads
    from stratax._src.parameter_server.tasks.server import Server, prepare_process, serve

    resolver = TFConfigClusterResolver()
    job = args.job or resolver.task_type
    index = args.index if args.index is not None else resolver.task_id
    if job == "worker" and index is not None:  # this process only serves
        compute_threads.limit_worker_threads(resolver.cluster_spec(), index)
    prepare_process()
    return serve(lambda: Server(resolver, job_name=job, task_index=index))


def main(argv: Sequence[str] | None = None) -> int:
    """Runs ``stratax`` on ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    names = _registered_strategies() if _command(argv) == "train" else None
    args = build_parser(names).parse_args(argv)
    if args.log_level is not None:
        os.environ[env.STRATAX_LOG_LEVEL] = args.log_level
        logs.configure(args.log_level)
    return int(args.handler(args))


def _command(argv: Sequence[str]) -> str | None:
    """The sub-command named in ``argv`` (its first word that is neither an option nor the
    value of ``--log-level``), if any."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def _registered_strategies() -> list[str]:
    # Imports JAX (not starting it): only `train` needs the names, so `launch` stays light.
    from stratax._src.strategies.registry import strategy_names

    return strategy_names()


def _version() -> str:
    try:
        return metadata.version("stratax")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    sys.exit(main())
