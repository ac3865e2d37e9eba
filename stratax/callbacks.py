"""Keras callbacks of stratax: ``sx.callbacks.TensorBoard`` (no TensorFlow needed) and
``sx.callbacks.WorkerMetrics`` (per-worker speed for the dashboard).

``sx.BackupAndRestore`` stays at the top level, as ``tf.keras.callbacks.BackupAndRestore``'s
stratax twin. Importing this module runs stratax's install step (it needs Keras).
"""

from stratax._src.keras.install import install as _install

_install()

from stratax._src.keras.callbacks.tensorboard import TensorBoard  # noqa: E402
from stratax._src.keras.callbacks.worker_metrics import WorkerMetrics  # noqa: E402

__all__ = ["TensorBoard", "WorkerMetrics"]
