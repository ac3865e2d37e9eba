"""The timing rule every benchmark child shares: Keras' epochs timed by a callback.

One module for the Keras children (``benchmarks.harness.child``,
``benchmarks.workloads.input_pipelines``, ``benchmarks.workloads.gpu_bench``) and the PyTorch peer
(``benchmarks.peers.torch_train``), so that every system is timed alike and the PyTorch peer need
not import the Keras child that starts it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness.configs import GLOBAL_BATCH, WARMUP_EPOCHS


def epoch_timer(keras: Any, sync: Callable[[], None]) -> Any:
    """A callback of ``keras`` (Keras 3 or tf-keras) timing each epoch and the first execution.

    ``sync`` waits for the devices (JAX's ``block_until_ready``; nothing on TensorFlow's CPU).
    """

    class EpochTimer(keras.callbacks.Callback):
        """Wall time at every epoch's begin and end, and when the first execution is done."""

        # tf-keras (Keras 2): do not turn batch logs into numpy (that would wait every step).
        _supports_tf_logs = True

        def __init__(self) -> None:
            super().__init__()
            self.begins: list[float] = []
            self.ends: list[float] = []
            self.executions = 0
            self.first_done: float | None = None

        def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self.executions += 1
            if self.executions == 2:  # the first execution has been dispatched: wait for it
                sync()
                self.first_done = time.perf_counter()

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.begins.append(time.perf_counter())

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self.ends.append(time.perf_counter())

    return EpochTimer()


def timed_result(begins: list[float], ends: list[float], times: tuple[float, float, float],
                 steps_per_epoch: int, timed_epochs: int) -> dict[str, Any]:
    """The throughput and timing fields of a result, from each epoch's begin and end.

    ``times`` is (training start, first execution done, training end). Shared by the Keras
    children and the PyTorch peer (``benchmarks.peers.torch_train``), so both are timed alike.
    """
    t_fit, first_done, t_done = times
    epoch_s = [e - b for b, e in zip(begins, ends, strict=True)]
    window = ends[-1] - begins[WARMUP_EPOCHS]
    steady_epoch = statistics.median(epoch_s[WARMUP_EPOCHS:])
    warmup = ends[WARMUP_EPOCHS - 1] - t_fit
    return {
        "status": "ok",
        "samples_per_s": timed_epochs * steps_per_epoch * GLOBAL_BATCH / window,
        # Training start until the first execution (1 or spe steps) is done: input pipeline
        # set-up, tracing, compilation and the first run.
        "first_execution_s": first_done - t_fit,
        # Extra wall time of the warm-up epoch over a steady epoch (a noisier estimate of the
        # one-off costs, kept in the raw results only).
        "warmup_overhead_s": warmup - WARMUP_EPOCHS * steady_epoch,
        # Throughput of the median timed epoch: tells one-off costs inside the timed window
        # (a recompilation in epoch 2, say) apart from the steady rate.
        "median_epoch_samples_per_s": steps_per_epoch * GLOBAL_BATCH / steady_epoch,
        "timed_window_s": window,
        "warmup_epoch_s": warmup,
        "epoch_s": epoch_s,
        "steps_trained": (WARMUP_EPOCHS + timed_epochs) * steps_per_epoch,
        "fit_s": t_done - t_fit,
    }
