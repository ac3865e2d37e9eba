"""Keras callbacks of stratax: ``sx.callbacks.TensorBoard`` (no TensorFlow needed) and
``sx.callbacks.WorkerMetrics`` (per-worker speed for the dashboard).

``sx.BackupAndRestore`` stays at the top level, as ``tf.keras.callbacks.BackupAndRestore``'s
stratax twin.
"""

from stratax._src.observe.tensorboard import TensorBoard
from stratax._src.observe.worker_metrics import WorkerMetrics

__all__ = ["TensorBoard", "WorkerMetrics"]
