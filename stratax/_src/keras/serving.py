"""Serving a model whose tables no machine holds whole: rows read from a sharded checkpoint.

A model trained under ``ParameterServerStrategy`` with tables built by its servers is saved
with ``strategy.save_checkpoint(directory)``. ``for_serving(model, directory)`` returns the
same model for inference in any process: each such ``Embedding`` is replaced by a
``RowLookup`` layer that reads the rows a batch looks up from the checkpoint's files (memory
maps: the operating system pages in the rows used, no process copies the table), and every
other variable is loaded from the checkpoint. The result is a plain Keras model: ``predict``
it, or ``save`` it as a ``.keras`` file (small: the tables stay in the checkpoint directory,
which the file names) and ``keras.models.load_model`` it wherever the directory is readable.

Example:
  >>> strategy.save_checkpoint("/ckpt/recommender")                        # doctest: +SKIP
  >>> served = sx.serving.for_serving(model, "/ckpt/recommender")           # doctest: +SKIP
  >>> served.save("/models/recommender.keras")                              # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

import jax
import keras
import numpy as np

from stratax._src.checkpoint import entries, sharded_variables
from stratax._src.keras.checkpoint_variables import load_variables
from stratax._src.parameter_server.shard_init import remote_recipe


@keras.saving.register_keras_serializable(package="stratax")
class RowLookup(keras.layers.Layer):
    """An ``Embedding`` for inference whose table is a variable of a sharded checkpoint.

    ``call(ids)`` returns ``table[ids]`` (shape ``ids.shape + (dim,)``), gathered on the host
    from the checkpoint's memory-mapped parts; under ``jit`` too (a host callback). Ids outside
    the table are an error naming the range (JAX raises it as its runtime error).

    Args:
      checkpoint: The directory given to ``strategy.save_checkpoint`` (its committed version
        is read when the layer is built).
      variable: The table's name in the checkpoint, e.g. ``"embedding/embeddings"``.

    Example:
      >>> lookup = sx.serving.RowLookup("/ckpt/recommender", "embedding/embeddings")
      ... # doctest: +SKIP
      >>> lookup(np.array([[3, 7]])).shape                                  # doctest: +SKIP
      (1, 2, 16)
    """

    def __init__(self, checkpoint: str, variable: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.checkpoint = os.fspath(checkpoint)
        self.variable = variable
        version, saved = sharded_variables.read_manifest(self.checkpoint)
        _, entry = entries.find(saved, variable, None, self.checkpoint)
        if len(entry["shape"]) != 2:
            raise ValueError(f"RowLookup reads a table of rank 2; {variable!r} in "
                             f"{self.checkpoint!r} has shape {tuple(entry['shape'])}.")
        self.rows, self.dim = entry["shape"]
        self.table_dtype = np.dtype(entry["dtype"])
        self._parts = [(part["start"], part["rows"],
                        np.load(version / f"{part['file']}.npy", mmap_mode="r",
                                allow_pickle=False))
                       for part in entry["parts"]]

    def _gather(self, ids: np.ndarray) -> np.ndarray:
        flat = np.asarray(ids).reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= self.rows):
            raise IndexError(f"RowLookup {self.variable!r}: ids must be in [0, {self.rows}), "
                             f"got {flat.min()}..{flat.max()}.")
        out = np.empty((flat.size, self.dim), self.table_dtype)
        for start, rows, part in self._parts:
            where = np.flatnonzero((flat >= start) & (flat < start + rows))
            if where.size:
                out[where] = part[flat[where] - start]
        return out.reshape((*np.shape(ids), self.dim))

    def call(self, ids: Any) -> Any:
        shape = jax.ShapeDtypeStruct((*ids.shape, self.dim), self.table_dtype)
        return jax.pure_callback(self._gather, shape, ids)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (*input_shape, self.dim)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "checkpoint": self.checkpoint, "variable": self.variable}


def for_serving(model: Any, checkpoint: str) -> keras.Model:
    """``model`` (trained under ``ParameterServerStrategy``) for inference in any process: its
    ``Embedding`` layers whose tables were built by the servers become ``RowLookup`` layers
    over the sharded ``checkpoint`` (from ``strategy.save_checkpoint``), and every other
    variable is loaded from it (see the module docstring).

    Raises:
      ValueError: ``checkpoint`` is not a committed sharded checkpoint, or lacks a variable of
        the model (the message names it).
    """
    def clone(layer: Any) -> Any:
        table = getattr(layer, "embeddings", None)
        if isinstance(layer, keras.layers.Embedding) and remote_recipe(table) is not None:
            return RowLookup(checkpoint, entries.entry_name(table.path),
                             name=layer.name)
        return layer.__class__.from_config(layer.get_config())

    served = keras.models.clone_model(model, clone_function=clone)
    if served.variables:
        load_variables(checkpoint, served.variables)
    return served

