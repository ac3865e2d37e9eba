"""Command-line front end of ``stratax train``: its flags and their runner.

``stratax/_src/cli.py`` adds these flags to its ``train`` sub-command and calls
:func:`run_train`. Building the parser imports neither JAX nor Keras; :func:`run_train` applies
``--devices`` before anything queries JAX's devices, then imports the Keras runner.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from stratax._src.observe.arguments import add_dashboard_arguments, dashboard_from_args
from stratax._src.observe.events import EventLog
from stratax._src.train import config as cfg

EXIT_OK = 0
EXIT_FAILURE = 1  # training failed or ended below --min-accuracy
EXIT_USAGE = 2  # argparse's code for a bad command line


def default_verbose() -> int:
    """Keras' progress bar (1) on a terminal, one line per epoch (2) when output is a file/pipe."""
    isatty = getattr(sys.stdout, "isatty", None)
    return 1 if isatty is not None and isatty() else 2


def normalize_strategy_name(name: str) -> str:
    """``"One-Device"`` -> ``"one_device"``: the registry's spelling (``-`` and ``_`` are equal)."""
    return name.strip().lower().replace("-", "_")


def add_train_arguments(
    parser: argparse.ArgumentParser, strategy_names: Sequence[str] | None = None
) -> None:
    """Adds the ``stratax train`` flags to ``parser``.

    Args:
        parser: the parser (or sub-parser) to extend.
        strategy_names: the registered strategies, offered as ``--strategy`` choices; ``None``
            accepts any name and lets the registry reject unknown ones when the run starts.
    """
    parser.add_argument(
        "--strategy", type=normalize_strategy_name, default=cfg.DEFAULT_STRATEGY,
        choices=list(strategy_names) if strategy_names is not None else None, metavar="NAME",
        help=f"distribution strategy (default: {cfg.DEFAULT_STRATEGY})"
             + (f"; one of: {', '.join(strategy_names)}" if strategy_names else ""),
    )
    parser.add_argument(
        "--devices", type=int, default=None, metavar="N",
        help="split the host CPU into N JAX devices, i.e. N CPU replicas (done before JAX "
             "starts; same as STRATAX_CPU_DEVICES=N). Default: the devices JAX finds: all "
             "GPUs/TPU cores, else one CPU device",
    )
    parser.add_argument("--model", choices=cfg.MODEL_NAMES, default=cfg.DEFAULT_MODEL,
                        help="mlp: 64-128-64-10 dense network; cnn: small Conv2D network on "
                             f"8x8x1 images (default: {cfg.DEFAULT_MODEL})")
    parser.add_argument("--epochs", type=int, default=cfg.DEFAULT_EPOCHS, metavar="E",
                        help=f"passes over the training split (default: {cfg.DEFAULT_EPOCHS})")
    parser.add_argument("--batch-size", "--batch_size", type=int, default=cfg.DEFAULT_BATCH_SIZE,
                        metavar="B",
                        help="GLOBAL batch size, split over the replicas; must be a multiple of "
                             f"the replica count (default: {cfg.DEFAULT_BATCH_SIZE})")
    parser.add_argument("--learning-rate", "--lr", type=float, default=cfg.DEFAULT_LEARNING_RATE,
                        metavar="LR",
                        help=f"Adam learning rate (default: {cfg.DEFAULT_LEARNING_RATE:g})")
    parser.add_argument("--seed", type=int, default=cfg.DEFAULT_SEED,
                        help="seed for weights and shuffling; the train/test split is fixed "
                             f"(default: {cfg.DEFAULT_SEED})")
    parser.add_argument("--verbose", "-v", type=int, choices=(0, 1, 2), default=None,
                        help="0 silent, 1 Keras progress bar, 2 one line per epoch (default: 1 "
                             "when stdout is a terminal, else 2)")
    parser.add_argument("--min-accuracy", type=float, default=None, metavar="A",
                        help="exit with code 1 if the test accuracy ends below A, e.g. 0.95 "
                             "(default: no threshold)")
    add_dashboard_arguments(parser)


def config_from_args(args: argparse.Namespace) -> cfg.TrainConfig:
    """The :class:`TrainConfig` of parsed ``stratax train`` arguments (validated).

    Raises:
        ValueError: a flag is out of range.
    """
    config = cfg.TrainConfig(
        strategy=args.strategy,
        devices=args.devices,
        model=args.model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
        verbose=default_verbose() if args.verbose is None else args.verbose,
        min_accuracy=args.min_accuracy,
        run_dir=getattr(args, "run_dir", None),
    )
    config.validate()
    return config


def run_train(args: argparse.Namespace) -> int:
    """Runs ``stratax train`` from parsed arguments; returns the process exit code.

    0 on success; 2 (one ``error:`` line on stderr) for a bad flag, an unknown strategy or a
    batch size that does not split over the replicas; 1 when training fails or the test
    accuracy ends below ``--min-accuracy``. ``--dashboard`` serves the run's dashboard live.
    """
    try:
        with dashboard_from_args(args, "stratax train") as run_dir:
            if run_dir is None:
                return _run_train(args)
            args.run_dir = str(run_dir)
            events = EventLog(run_dir)
            events.append("start", restart=0, tasks=["main"], pids=[os.getpid()])
            try:
                code = _run_train(args)
            except BaseException as error:  # the page shows how the run ended, then it raises
                events.append("end", exit_code=1, message=f"stratax train failed: {error!r}")
                raise
            events.append("end", exit_code=code, message=f"stratax train exited with {code}")
            return code
    except ValueError as err:  # the dashboard could not start
        _print_error(str(err))
        return EXIT_USAGE


def _run_train(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as err:
        _print_error(str(err))
        return EXIT_USAGE
    # Imported here, after the flags are checked: the runner imports Keras, and --devices
    # must be applied (inside run_training) before anything queries JAX's devices.
    from stratax._src.train.runner import run_training

    try:
        result = run_training(config)
    except ValueError as err:
        _print_error(str(err))
        return EXIT_USAGE
    except RuntimeError as err:
        _print_error(str(err))
        return EXIT_FAILURE
    if config.min_accuracy is not None and result.test_accuracy < config.min_accuracy:
        _print_error(
            f"test accuracy {result.test_accuracy:.4f} is below --min-accuracy "
            f"{config.min_accuracy}; train longer (e.g. --epochs {2 * config.epochs}) or lower "
            "the threshold."
        )
        return EXIT_FAILURE
    return EXIT_OK


def build_parser(
    prog: str | None = None, strategy_names: Sequence[str] | None = None
) -> argparse.ArgumentParser:
    """A stand-alone parser with the train flags."""
    parser = argparse.ArgumentParser(prog=prog or "stratax train", description=DESCRIPTION)
    add_train_arguments(parser, strategy_names)
    return parser


DESCRIPTION = (
    "Train a classifier on the 8x8 handwritten digits embedded in stratax (1,797 images, no "
    "download) with a distribution strategy, then print test accuracy, throughput, replica "
    "count and strategy on one summary line."
)


def _print_error(message: str) -> None:
    print(f"stratax train: error: {message}", file=sys.stderr, flush=True)
