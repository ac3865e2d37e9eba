"""Runs ``stratax train``: the embedded digits, a Keras classifier, ``fit`` under a strategy.

This is the whole of TensorFlow's MirroredStrategy guide as one command, on data shipped with
the package (no download). Call :func:`run_training` after the CPU split
(``TrainConfig.devices``) may still be applied, i.e. before anything queried JAX's devices.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import sys
import time
from typing import Any, TextIO

import keras

from stratax._src.datasets import load_digits
from stratax._src.runtime.devices import device_name, local_replica_ids
from stratax._src.startup import set_cpu_device_count
from stratax._src.strategies.registry import strategy_from_name
from stratax._src.train.config import TrainConfig, check_batch_size
from stratax._src.train.models import build_model

logger = logging.getLogger(__name__)

SUMMARY_PREFIX = "stratax train: done:"


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What one ``stratax train`` run measured.

    ``samples_per_second`` is the steady training throughput: training samples per epoch over
    the median wall time of the timed epochs, which are every epoch but the first (it includes
    XLA compilation) when there are at least two, else the first one.
    ``mean_samples_per_second`` is total samples over total time of the same epochs.
    ``wall_seconds`` runs from device set-up to the end of evaluation (imports not included).
    """

    test_accuracy: float
    test_loss: float
    samples_per_second: float
    mean_samples_per_second: float
    timed_epochs: int
    num_replicas: int
    strategy_name: str
    strategy_class: str
    model: str
    epochs: int
    batch_size: int
    train_samples: int
    test_samples: int
    wall_seconds: float

    def summary_line(self) -> str:
        """The one-line report printed at the end, e.g. ``stratax train: done: test accuracy
        0.9694 | 41,205 train samples/s (median of epochs 2-30) | 2 replicas | mirrored
        (MirroredStrategy) | mlp, 30 epochs, global batch 64 | wall 5.2 s``."""
        if self.epochs > 2:
            timed = f"median of epochs 2-{self.epochs}"
        else:
            timed = "epoch 2" if self.epochs == 2 else "1 epoch, compile included"
        replicas = _plural(self.num_replicas, "replica")
        return (
            f"{SUMMARY_PREFIX} test accuracy {self.test_accuracy:.4f} | "
            f"{self.samples_per_second:,.0f} train samples/s ({timed}) | {replicas} | "
            f"{self.strategy_name} ({self.strategy_class}) | {self.model}, "
            f"{_plural(self.epochs, 'epoch')}, global batch {self.batch_size} | "
            f"wall {self.wall_seconds:.1f} s"
        )


class EpochTimer(keras.callbacks.Callback):
    """Records each epoch's wall time.

    Keras turns the epoch-end logs into Python floats before this callback runs, so the device
    work of the epoch has finished when the time is taken.
    """

    def __init__(self) -> None:
        super().__init__()
        self.durations: list[float] = []
        self._start = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.durations.append(time.perf_counter() - self._start)


def throughput(durations: list[float], samples_per_epoch: int) -> tuple[float, float, int]:
    """``(steady samples/s, mean samples/s, epochs timed)`` from per-epoch wall times.

    The first epoch holds XLA compilation, so it is left out when there are later ones. The
    steady rate uses the median of the timed epochs, so a stray recompilation or a busy moment
    on the host does not skew it; the mean rate is total samples over total time.
    """
    timed = durations[1:] if len(durations) > 1 else durations
    total = sum(timed)
    median = statistics.median(timed)
    steady = samples_per_epoch / median if median > 0 else float("nan")
    mean = samples_per_epoch * len(timed) / total if total > 0 else float("nan")
    return steady, mean, len(timed)


def run_training(config: TrainConfig, out: TextIO | None = None) -> TrainResult:
    """Trains and evaluates the configured classifier; prints a header and the summary line.

    Args:
        config: what to train.
        out: where the header and summary go (default: the current ``sys.stdout``); Keras'
            progress output always goes to ``sys.stdout``.

    Raises:
        ValueError: a bad configuration (see ``TrainConfig.validate``), an unknown strategy, or a
            global batch that does not split over the replicas.
        RuntimeError: ``config.devices`` was given after JAX already started with another count.
    """
    config.validate()
    out = sys.stdout if out is None else out
    wall_start = time.perf_counter()
    if config.devices is not None:
        set_cpu_device_count(config.devices)
    strategy = strategy_from_name(config.strategy)
    replicas = strategy.num_replicas_in_sync
    check_batch_size(config.batch_size, replicas)
    if config.devices is not None and any(d.platform != "cpu" for d in strategy.devices):
        logger.warning("--devices %d split the CPU, but %s runs on %s devices.",
                       config.devices, config.strategy, strategy.devices[0].platform)

    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        model, flat = build_model(config.model)
        model.compile(
            optimizer=keras.optimizers.Adam(config.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    (x_train, y_train), (x_test, y_test) = load_digits(flatten=flat)
    local = [strategy.devices[i] for i in local_replica_ids(strategy.devices)]
    names = ", ".join(device_name(d) for d in local)
    if len(local) < replicas:
        names += f"; {replicas - len(local)} more in other processes"
    print(
        f"stratax train: {config.model} on {len(x_train)} digits ({len(x_test)} held out), "
        f"{type(strategy).__name__} with {_plural(replicas, 'replica')} [{names}], global batch "
        f"{config.batch_size} ({config.batch_size // replicas} per replica), "
        f"{_plural(config.epochs, 'epoch')}",
        file=out, flush=True,
    )

    timer = EpochTimer()
    callbacks: list[keras.callbacks.Callback] = [timer]
    if config.run_dir is not None:
        from stratax._src.keras.callbacks.worker_metrics import WorkerMetrics

        callbacks.append(WorkerMetrics(config.run_dir, task="main"))
    model.fit(x_train, y_train, batch_size=config.batch_size, epochs=config.epochs,
              verbose=config.verbose, callbacks=callbacks)
    test_loss, test_accuracy = model.evaluate(x_test, y_test, batch_size=config.batch_size,
                                              verbose=0)
    steady, mean, timed = throughput(timer.durations, len(x_train))
    result = TrainResult(
        test_accuracy=float(test_accuracy),
        test_loss=float(test_loss),
        samples_per_second=steady,
        mean_samples_per_second=mean,
        timed_epochs=timed,
        num_replicas=replicas,
        strategy_name=config.strategy,
        strategy_class=type(strategy).__name__,
        model=config.model,
        epochs=config.epochs,
        batch_size=config.batch_size,
        train_samples=len(x_train),
        test_samples=len(x_test),
        wall_seconds=time.perf_counter() - wall_start,
    )
    print(result.summary_line(), file=out, flush=True)
    return result


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
