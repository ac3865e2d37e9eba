"""Exact steps on a padded last batch under ``TPUStrategy`` (``tpu_runner``'s docstring says
why): the batch padded to the static size with weights that count its real rows, the metric
variables with the padding rows' terms removed, and predictions cropped to the real rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np


class RowWeights(np.ndarray):
    """A batch's sample weights that also carry how many of its rows are real (``real_rows``)
    and whether the global batch it is part of was padded (``padded``: every host knows)."""

    real_rows: int
    padded: bool

    def __array_finalize__(self, obj: Any) -> None:
        self.real_rows = getattr(obj, "real_rows", 0)
        self.padded = getattr(obj, "padded", False)


def pad_batch(batch: Any, size: int) -> tuple[Any, Any, RowWeights]:
    """``(x, y, sample_weight)`` padded with zero rows to ``size``; ``real_rows`` counts the rest.

    Real rows keep their weight (1 when there were none), padding rows get 0. The step scales
    the real rows' weights by ``B / n`` once it knows ``n``, the real rows of the global batch
    (every host's), ``B`` the global batch size.

    Raises:
        ValueError: the batch has more than ``size`` rows.
    """
    x, y, weights = keras.utils.unpack_x_y_sample_weight(batch)
    rows = int(np.shape(jax.tree.leaves(x)[0])[0])
    if rows > size:
        raise ValueError(
            f"A batch of {rows} rows is larger than the static batch size {size} that TPU steps "
            "are compiled for; give every batch at most that many rows (the global batch_size)."
        )
    base = np.ones(rows, np.float32) if weights is None else np.asarray(weights, np.float32)

    def pad(leaf: Any) -> Any:
        array = np.asarray(leaf)
        if array.shape[0] == size:
            return array
        filler = np.zeros((size - rows, *array.shape[1:]), dtype=array.dtype)
        return np.concatenate([array, filler])

    padded_weights = pad(base).view(RowWeights)
    padded_weights.real_rows = rows
    padded_weights.padded = rows < size
    return jax.tree.map(pad, x), (None if y is None else jax.tree.map(pad, y)), padded_weights


def exact_padded_metrics(step_fn: Callable[[Any, Any], tuple[Any, Any]], state: Any,
                          batch: Any, rows: Any, size: int, index: int) -> list[Any]:
    """The metric variables after the ``rows`` real rows of a padded ``batch`` (the real rows
    with their own weights, padding rows weight 0), exactly.

    Two more runs of the step from the same ``state`` (their trained variables are dropped):
    C with the real rows' own weights and Z with only padding rows. Every
    metric update is a sum of per-row terms, and every padding row is the same zero row, so
    ``M = M_C - (size - rows) / size * (M_Z - M_0)`` removes the padding rows' terms: from
    metrics that ignore weights (``compile(metrics=...)``), from the loss tracker's count
    (Keras weights it by the padded row count) and from its regularisation part.
    """
    _, with_own = step_fn(state, batch)
    padding = jax.tree.map(jnp.zeros_like, batch)
    _, padding_only = step_fn(state, padding)
    share = (size - rows).astype(jnp.float32) / size

    def exact(before: Any, own_rows: Any, pads: Any) -> Any:
        if not jnp.issubdtype(own_rows.dtype, jnp.floating):
            return own_rows
        return own_rows - (share * (pads - before)).astype(own_rows.dtype)

    return [exact(b, c, z) for b, c, z in
            zip(state[index], with_own[index], padding_only[index], strict=True)]


def replace_metrics(state: Any, index: int, value: Any) -> Any:
    """The step state ``state`` with its part ``index`` (the metric variables) ``value``."""
    return (*state[:index], value, *state[index + 1:])


def metrics_logs(model: Any, metric_values: Any) -> dict[str, Any]:
    """The logs Keras would report for these metric variable values (``get_metrics_result``)."""
    mapping = list(zip(model.metrics_variables, metric_values, strict=True))
    with keras.StatelessScope(state_mapping=mapping):
        return model.get_metrics_result()


def crop_predictions(outputs: Any, real: Any, steps: int, hosts: int) -> Any:
    """Predictions of the real rows only, in order: of step ``i`` (of the first ``steps``),
    each host's block keeps its first ``real`` rows (``real``: the step's real-row counts per
    replica, each host's in its first replica's column)."""
    counts = np.asarray(real)[:steps].reshape(steps, hosts, -1).sum(axis=2)

    def crop(stacked: Any) -> np.ndarray:
        array = np.asarray(stacked)
        blocks = array.reshape(array.shape[0], hosts, -1, *array.shape[2:])
        return np.concatenate([blocks[i, h, :counts[i, h]] for i in range(steps)
                               for h in range(hosts)])

    return jax.tree.map(crop, outputs)
