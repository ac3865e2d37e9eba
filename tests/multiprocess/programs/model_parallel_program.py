"""What each worker runs in tests/multiprocess/test_model_parallel.py (2 workers x 2 devices).

Usage: python model_parallel_program.py OUT_DIR. Under
``MultiWorkerMirroredStrategy(cores_per_replica=C, layout_map=...)`` for C = 4 (one replica
whose 4 cores span both workers) and C = 2 (2 replicas of 2 cores, one per worker), trains
:func:`make`'s model with ``fit``, then ``evaluate``s and ``predict``s, and writes
OUT_DIR/cores<C>_<worker>.npz (:func:`run`'s results) and the model's ``model.save`` to
OUT_DIR/cores<C>_<worker>.keras. Then calls ``get_weights`` with worker 1 short of memory:
both must refuse; doubles the weights with ``set_weights``; distributes a dataset for a
custom loop. Prints "cores <C> mesh <shape> local <bytes>" (the bytes of model and optimizer
state this process holds), "refused <message>", "set_weights <True if read back doubled>",
"custom loop <error>" (4 cores only) and "done <worker>".
"""

import os
import sys

import keras
import numpy as np
from data import GLOBAL_BATCH, make_data

import stratax as sx
from stratax._src.keras import model_parallel

memory_left = model_parallel._memory_left


def layout_map():
    """Megatron-style: the hidden layers' units split over "core", the second hidden kernel
    also over "replica" (FSDP), the head's inputs over "core"."""
    layout = keras.distribution.LayoutMap(None)
    layout[".*hidden_a.*kernel"] = (None, "core")
    layout[".*hidden_a.*bias"] = ("core",)
    layout[".*hidden_b.*kernel"] = ("replica", "core")
    layout[".*head.*kernel"] = ("core", None)
    return layout


def make():
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((10,)),
                              keras.layers.Dense(16, activation="relu", name="hidden_a"),
                              keras.layers.Dense(16, activation="relu", name="hidden_b"),
                              keras.layers.Dense(4, name="head")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def run(strategy):
    """fit (2 epochs; 150 rows: the last batch of 6 does not split over 2 replicas),
    evaluate, predict and the weights, as a dict of arrays."""
    x, y = make_data()
    with strategy.scope():
        model = make()
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=True, verbose=0)
    scores = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    predictions = model.predict(x, batch_size=GLOBAL_BATCH, verbose=0)
    return model, {"loss": np.asarray(history.history["loss"]),
                   "accuracy": np.asarray(history.history["accuracy"]),
                   "eval": np.asarray([scores["loss"], scores["accuracy"]]),
                   "predictions": predictions,
                   **{f"w{i}": w for i, w in enumerate(model.get_weights())}}


def local_bytes(model):
    """Bytes of the model's and its optimizer's variables held on this process's devices."""
    values = [v.value for v in [*model.variables, *model.optimizer.variables]]
    return sum(s.data.nbytes for a in values for s in a.addressable_shards)


if __name__ == "__main__":
    options = sx.CommunicationOptions(timeout_seconds=60)
    for cores in (4, 2):
        strategy = sx.MultiWorkerMirroredStrategy(cores_per_replica=cores,
                                                  layout_map=layout_map(),
                                                  communication_options=options)
        model, results = run(strategy)
        print("cores", cores, "mesh", dict(strategy.mesh.shape), "local", local_bytes(model),
              flush=True)
        worker = strategy.worker_index
        model.save(os.path.join(sys.argv[1], f"cores{cores}_{worker}.keras"))
        if worker == 1:  # one worker short of memory: both refuse, neither waits for the other
            model_parallel._memory_left = lambda: 0
        try:
            model.get_weights()
        except MemoryError as err:
            print("refused", err, flush=True)
        model_parallel._memory_left = memory_left
        model.set_weights([w * 2 for w in model.get_weights()])  # placed back into parts
        print("set_weights", all(np.array_equal(a, b * 2) for a, b in zip(
            model.get_weights(), (results[f"w{i}"] for i in range(6)), strict=True)), flush=True)
        try:
            iter(strategy.experimental_distribute_dataset(np.zeros((16, 10), np.float32)))
        except ValueError as err:
            print("custom loop", err, flush=True)
        np.savez(os.path.join(sys.argv[1], f"cores{cores}_{strategy.worker_index}.npz"),
                 **results)
    print("done", strategy.worker_index, flush=True)
