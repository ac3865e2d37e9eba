"""``DatasetCreator``: TensorFlow's ``keras.utils.experimental.DatasetCreator`` for stratax.

``model.fit(sx.DatasetCreator(dataset_fn), steps_per_epoch=...)`` under
``ParameterServerStrategy`` builds the data on each worker: ``dataset_fn(input_context)`` runs
there (``input_context.input_pipeline_id`` is the worker index) and reaches the worker by name,
as ``ClusterCoordinator.create_per_worker_dataset``'s function does (docs/parameter_server.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class DatasetCreator:
    """A per-worker dataset function given to ``model.fit``/``evaluate``/``predict``.

    Args:
      dataset_fn: A module-level function ``dataset_fn(input_context) -> iterable of batches``
        (tuples ``(x, y[, sample_weight])`` or dicts of numpy arrays), usually endless;
        defined before the strategy is created or in an importable module, since workers
        import it by name.
      input_options: TensorFlow's ``tf.distribute.InputOptions``; stratax has no use for it
        here, so only ``None`` is accepted.

    Example:
      >>> def dataset_fn(input_context):                                    # doctest: +SKIP
      ...     rng = np.random.default_rng(input_context.input_pipeline_id)
      ...     while True:
      ...         x = rng.normal(size=(64, 8)).astype("float32")
      ...         yield x, x.sum(axis=1)
      >>> model.fit(sx.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=50)  # doctest: +SKIP
    """

    def __init__(self, dataset_fn: Callable[..., Any], input_options: Any = None) -> None:
        if not callable(dataset_fn):
            raise TypeError(f"DatasetCreator needs a callable dataset_fn, got {dataset_fn!r}.")
        if input_options is not None:
            raise ValueError(f"DatasetCreator(input_options={input_options!r}) is not used by "
                             "stratax: workers build and read their batches themselves; drop it.")
        self.dataset_fn = dataset_fn

    def __repr__(self) -> str:
        return f"DatasetCreator({getattr(self.dataset_fn, '__qualname__', self.dataset_fn)!r})"
