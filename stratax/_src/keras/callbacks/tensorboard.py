"""``TensorBoard``: Keras' TensorBoard callback, written without TensorFlow (with ``tensorboardX``).

``keras.callbacks.TensorBoard`` writes through ``tensorflow.summary``, so it needs TensorFlow.
This callback takes the same arguments and writes the same tags to the same places, through the
``tensorboardX`` event writer (TensorBoard's own file format; no hand-written encoder):

- ``<log_dir>/train``: ``epoch_<metric>``, ``epoch_learning_rate``, ``epoch_steps_per_second``
  at step = epoch; ``batch_<metric>`` (and ``batch_steps_per_second``) every ``update_freq``
  batches; ``<weight path>/histogram`` every ``histogram_freq`` epochs (as Keras);
- ``<log_dir>/validation``: ``epoch_<metric>`` (``val_`` removed) at step = epoch and
  ``evaluation_<metric>_vs_iterations`` at step = optimizer iterations (as Keras);
- ``write_graph``: Keras writes the model config and the TF graph; here the model config
  (JSON) as the text summary ``keras_model/config`` (JAX has no TF graph);
- ``write_images``, ``embeddings_freq``, ``profile_batch``: not supported, a ``ValueError``
  says what to use.

Only the chief writes (the model's strategy decides, as for checkpoints); other workers' calls
do nothing. Install the writer with ``pip install "stratax[tensorboard]"``.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np

from stratax._src.keras.binding import model_strategy


def _summary_writer_class() -> Any:
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ImportError(
            "sx.callbacks.TensorBoard writes with the tensorboardX package, which is not "
            "installed; run `pip install \"stratax[tensorboard]\"` (or `pip install tensorboardX`)."
        ) from None
    return SummaryWriter


class TensorBoard(keras.callbacks.Callback):
    """Writes TensorBoard logs during ``fit`` without TensorFlow; Keras' arguments and tags.

    Args:
        log_dir: where to write (``train/`` and ``validation/`` sub-directories).
        histogram_freq: every how many epochs to write weight histograms (0: never).
        write_graph: write the model's Keras config (JSON) as a text summary.
        write_images: must be False (not supported).
        write_steps_per_second: also write training steps per second.
        update_freq: ``"epoch"``, ``"batch"`` or an int N: batch-level scalars every N batches.
        profile_batch: must be 0 (use ``jax.profiler.trace(log_dir)`` to profile).
        embeddings_freq: must be 0 (not supported).
        embeddings_metadata: ignored unless ``embeddings_freq`` (as in Keras).

    Example:
        >>> model.fit(x, y, epochs=5, callbacks=[sx.callbacks.TensorBoard("logs",
        ...           histogram_freq=1)])  # doctest: +SKIP
    """

    def __init__(self, log_dir: str = "logs", histogram_freq: int = 0, write_graph: bool = True,
                 write_images: bool = False, write_steps_per_second: bool = False,
                 update_freq: str | int = "epoch", profile_batch: Any = 0,
                 embeddings_freq: int = 0, embeddings_metadata: Any = None) -> None:
        super().__init__()
        unsupported = {"write_images": (write_images, "write histograms instead "
                                        "(histogram_freq=1)"),
                       "profile_batch": (profile_batch, "wrap the steps in "
                                         "jax.profiler.trace(log_dir)"),
                       "embeddings_freq": (embeddings_freq, "leave it 0")}
        for name, (value, fix) in unsupported.items():
            if value:
                raise ValueError(f"sx.callbacks.TensorBoard does not support {name}={value!r}; "
                                 f"{fix}.")
        if update_freq == "batch":
            update_freq = 1
        if update_freq != "epoch" and (isinstance(update_freq, bool)
                                       or not isinstance(update_freq, int) or update_freq < 1):
            raise ValueError(f"update_freq must be 'epoch', 'batch' or an int >= 1, got "
                             f"{update_freq!r}.")
        if isinstance(histogram_freq, bool) or not isinstance(histogram_freq, int) \
                or histogram_freq < 0:
            raise ValueError(f"histogram_freq must be an int >= 0, got {histogram_freq!r}.")
        self._writer_class = _summary_writer_class()
        self.log_dir = str(log_dir)
        self.histogram_freq = histogram_freq
        self.write_graph = write_graph
        self.write_steps_per_second = write_steps_per_second
        self.update_freq = update_freq
        self.embeddings_metadata = embeddings_metadata
        # Nothing per batch with epoch-level logging: Keras may then run batch ends
        # asynchronously instead of waiting for every step.
        self.async_safe = update_freq == "epoch" and not write_steps_per_second
        self._writers: dict[str, Any] = {}
        self._is_writer = True
        self._global_train_batch = 0
        self._batch_start = 0.0
        self._epoch_start = 0.0
        self._epoch_iterations = 0

    # ----------------------------------------------------------------- writers
    def set_model(self, model: Any) -> None:
        super().set_model(model)
        self._close_writers()
        strategy = model_strategy(model)
        self._is_writer = strategy is None or strategy.is_chief
        if self.write_graph and self._is_writer:
            self._writer("train").add_text("keras_model/config", model.to_json(), 0)

    def _writer(self, name: str) -> Any:
        if name not in self._writers:
            subdir = "train" if name == "train" else "validation"
            self._writers[name] = self._writer_class(logdir=f"{self.log_dir}/{subdir}",
                                                     flush_secs=10)
        return self._writers[name]

    def _scalars(self, writer: str, scalars: dict[str, Any], tag: str, step: int) -> None:
        """Writes each number of ``scalars`` as ``tag.format(name)`` (chief only)."""
        if not self._is_writer:
            return
        out = self._writer(writer)
        for name, value in scalars.items():
            if isinstance(value, (int, float, np.number)):
                out.add_scalar(tag.format(name), float(value), step)

    def _close_writers(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers = {}

    # ----------------------------------------------------------------- keras hooks
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._global_train_batch = 0

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._close_writers()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_start = time.time()
        self._epoch_iterations = self._iterations()

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._global_train_batch += 1
        if self.write_steps_per_second:
            self._batch_start = time.time()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.update_freq == "epoch":
            return
        step = self._global_train_batch
        scalars = dict(logs) if isinstance(logs, dict) else {}
        if self.write_steps_per_second:
            scalars["steps_per_second"] = 1.0 / max(time.time() - self._batch_start, 1e-9)
        if step % self.update_freq == 0:
            self._scalars("train", scalars, "batch_{}", step)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        if getattr(self.model, "optimizer", None) is not None and logs:
            self._scalars("validation", logs, "evaluation_{}_vs_iterations", self._iterations())

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        train = {k: v for k, v in logs.items() if not k.startswith("val_")}
        val = {k[4:]: v for k, v in logs.items() if k.startswith("val_")}
        train.update(self._learning_rates())
        if self.write_steps_per_second:
            elapsed = max(time.time() - self._epoch_start, 1e-9)
            train["steps_per_second"] = (self._iterations() - self._epoch_iterations) / elapsed
        self._scalars("train", train, "epoch_{}", epoch)
        if val:
            self._scalars("validation", val, "epoch_{}", epoch)
        if self.histogram_freq and epoch % self.histogram_freq == 0 and self._is_writer:
            self._log_weights(epoch)
        for writer in self._writers.values():
            writer.flush()

    # ----------------------------------------------------------------- values
    def _iterations(self) -> int:
        optimizer = getattr(self.model, "optimizer", None)
        iterations = getattr(optimizer, "iterations", None)
        return int(np.asarray(iterations)) if iterations is not None else 0

    def _learning_rates(self) -> dict[str, float]:
        optimizer = getattr(self.model, "optimizer", None)
        optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
        if optimizer is None:
            return {}
        if hasattr(optimizer, "optimizers"):
            return {f"learning_rate_{opt.name}": float(np.asarray(opt.learning_rate))
                    for opt in optimizer.optimizers}
        if isinstance(optimizer, keras.optimizers.Optimizer):
            return {"learning_rate": float(np.asarray(optimizer.learning_rate))}
        return {}

    def _log_weights(self, epoch: int) -> None:
        writer = self._writer("train")
        for layer in self.model.layers:
            for weight in layer.weights:
                name = weight.path.replace(":", "_")
                writer.add_histogram(f"{name}/histogram", np.asarray(weight), epoch)
