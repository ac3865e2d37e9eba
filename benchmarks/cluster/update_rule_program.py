"""One run of the parameter-server guide's model for ``benchmarks/workloads/update_rule.py``.

Usage::

    python update_rule_program.py one-device OUT.json SEED
    stratax launch --workers 2 --ps 2 update_rule_program.py dense OUT.json SEED   # or lazy

The guide's model (Embedding(1000, 64) -> LSTM(64) -> Dense(10), Adam, batches of 64,
``steps_per_execution=10``) learns "the label is the last token mod 10" from fresh batches:
``CHUNKS`` ``fit`` calls of ``STEPS`` steps each, the held-out accuracy measured after each.
``dense`` is Keras' Adam (every row's moments decay, stratax's default); ``lazy`` decays only
the rows a batch looked up (``optimizer.stratax_sparse_updates = "lazy"``). Writes
``{"steps": [...], "accuracy": [...], "seconds": ...}``.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

VOCAB, SEQ, BATCH, STEPS, CHUNKS = 1000, 5, 64, 10, 16


def make_batch(rng: np.random.Generator, rows: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.integers(0, VOCAB, size=(rows, SEQ)).astype(np.int32)
    return x, (x[:, -1] % 10).astype(np.int32)


def main() -> None:
    rule, out, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if rule == "one-device":
        strategy = None
    else:
        import stratax as sx

        strategy = sx.ParameterServerStrategy()   # on a worker or ps task: serves, then exits
    import contextlib

    import keras

    keras.utils.set_random_seed(seed)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((SEQ,), dtype="int32"),
                                  keras.layers.Embedding(VOCAB, 64), keras.layers.LSTM(64),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam", metrics=["accuracy"], steps_per_execution=10,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if rule == "lazy":
        model.optimizer.stratax_sparse_updates = "lazy"
    rng = np.random.default_rng(seed)
    x_test, y_test = make_batch(np.random.default_rng(10_000 + seed), 1024)
    steps, accuracy = [], []
    started = time.perf_counter()
    for chunk in range(CHUNKS):
        x, y = make_batch(rng, STEPS * BATCH)
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        steps.append((chunk + 1) * STEPS)
        accuracy.append(float(model.evaluate(x_test, y_test, batch_size=256, verbose=0)[1]))
    with open(out, "w") as f:
        json.dump({"rule": rule, "seed": seed, "steps": steps, "accuracy": accuracy,
                   "seconds": time.perf_counter() - started}, f)


if __name__ == "__main__":
    main()
