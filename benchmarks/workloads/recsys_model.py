"""The DLRM-shaped model of ``benchmarks.workloads.recsys``, one definition for Keras 3 and
tf-keras.

DLRM (Naumov et al., 2019): a bottom MLP turns the 13 dense features into a vector of the
embedding width; each of the 26 categorical features is looked up in its own
``keras.layers.Embedding``; the pairwise dot products of those 27 vectors (the upper triangle,
351 values) and the bottom vector feed a top MLP with a sigmoid output (click probability).

The builder takes the Keras module and a small ``ops`` namespace (``keras.ops`` for Keras 3;
TensorFlow functions for tf-keras, see ``recsys_tf_program.py``) so that every system trains the
same graph. Initial values come from numpy, per layer name, so every system starts from the
same weights whatever order its framework lists them in.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.workloads.recsys_data import CATEGORICAL, DENSE

EMBEDDING_DIM = 16
BOTTOM = (64,)
TOP = (64, 32)
LEARNING_RATE = 1.0  # the loss is a batch mean: a row seen once per batch gets 1/B of a step


def build(keras: Any, ops: Any, table_sizes: Sequence[int]) -> Any:
    """The functional DLRM model over inputs ``{"dense": (B, 13) float32, "ids": (B, 26)
    int32}``; ``ops`` needs ``stack``, ``matmul``, ``transpose``, ``reshape``, ``take`` and
    ``concatenate`` with ``keras.ops``' signatures."""
    if len(table_sizes) != CATEGORICAL:
        raise ValueError(f"DLRM here has {CATEGORICAL} tables, got {len(table_sizes)} sizes.")
    dense_in = keras.Input((DENSE,), name="dense")
    ids_in = keras.Input((CATEGORICAL,), dtype="int32", name="ids")
    x = dense_in
    for i, units in enumerate(BOTTOM):
        x = keras.layers.Dense(units, activation="relu", name=f"bottom_{i}")(x)
    x = keras.layers.Dense(EMBEDDING_DIM, activation="relu", name="bottom_out")(x)
    vectors = [x] + [keras.layers.Embedding(rows, EMBEDDING_DIM, name=f"table_{i}")(ids_in[:, i])
                     for i, rows in enumerate(table_sizes)]
    count = len(vectors)
    stacked = ops.stack(vectors, axis=1)                                   # (B, 27, dim)
    dots = ops.matmul(stacked, ops.transpose(stacked, (0, 2, 1)))          # (B, 27, 27)
    upper = [i * count + j for i in range(count) for j in range(i + 1, count)]
    pairs = ops.take(ops.reshape(dots, (-1, count * count)), np.array(upper, np.int32), axis=1)
    z = ops.concatenate([x, pairs], axis=1)
    for i, units in enumerate(TOP):
        z = keras.layers.Dense(units, activation="relu", name=f"top_{i}")(z)
    out = keras.layers.Dense(1, activation="sigmoid", name="click")(z)
    return keras.Model({"dense": dense_in, "ids": ids_in}, out, name="dlrm")


def set_initial_weights(model: Any, seed: int = 0) -> str:
    """Sets every weight from numpy (Glorot-uniform kernels, zero biases, embeddings uniform in
    +-0.05 as Keras draws them), seeded per layer name; returns a checksum of the values."""
    total = 0.0
    for layer in model.layers:
        weights = layer.get_weights()
        if not weights:
            continue
        rng = np.random.default_rng([seed, zlib.crc32(layer.name.encode())])
        values = []
        for w in weights:
            if layer.name.startswith("table_"):
                value = rng.uniform(-0.05, 0.05, size=w.shape)
            elif w.ndim == 2:
                limit = np.sqrt(6.0 / sum(w.shape))
                value = rng.uniform(-limit, limit, size=w.shape)
            else:
                value = np.zeros(w.shape)
            values.append(value.astype(np.float32))
            total += float(np.abs(value).sum())
        layer.set_weights(values)
    return f"{total:.6f}"


def compile_args(keras: Any) -> dict[str, Any]:
    """``model.compile``'s arguments: plain SGD, which every system applies with the same
    math to an embedding's touched rows, and binary cross-entropy on the probability."""
    return {"optimizer": keras.optimizers.SGD(LEARNING_RATE),
            "loss": keras.losses.BinaryCrossentropy()}
