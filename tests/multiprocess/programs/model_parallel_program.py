"""What each worker runs in tests/multiprocess/test_model_parallel_workers.py (2 workers x 2
devices).

Usage: python model_parallel_program.py OUT_DIR. Under
``MultiWorkerMirroredStrategy(cores_per_replica=C, layout_map=...)`` for C = 4 (one replica
whose 4 cores span both workers) and C = 2 (2 replicas of 2 cores, one per worker), trains
:func:`make`'s model with ``fit``, then ``evaluate``s and ``predict``s, and writes
OUT_DIR/cores<C>_<worker>.npz (:func:`run`'s results) and the model's ``model.save`` to
OUT_DIR/cores<C>_<worker>.keras. Then calls ``get_weights`` with worker 1 short of memory:
both must refuse; doubles the weights with ``set_weights``; distributes a dataset for a
custom loop. Prints "cores <C> mesh <shape> local <bytes>" (the bytes of model and optimizer
state this process holds), "refused <message>", "set_weights <True if read back doubled>",
"custom loop <error>" (4 cores only). Then fits :func:`run_cnn`'s CNN (2 cores per replica,
OUT_DIR/cnn_<worker>.npz), runs :func:`preempted` (OUT_DIR/preemption/, its checkpoints;
OUT_DIR/preempted_<worker>.npz, the weights and ``resumed_at``) and :func:`capped_fit`
(prints "capped ..." and "control ..."), and prints "done <worker>".
"""

import gc
import os
import resource
import signal
import sys
import time

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


def cnn_layout():
    """The convolution's output channels split over "core", the head's rows over "replica"
    (FSDP over the 2 workers' replicas)."""
    layout = keras.distribution.LayoutMap(None)
    layout[".*conv.*kernel"] = (None, None, None, "core")
    layout[".*conv.*bias"] = ("core",)
    layout[".*head.*kernel"] = ("replica", None)
    return layout


def run_cnn(strategy):
    """A small CNN (6x6x2 images, Conv2D(8, 3), Dense(4)) fit for 2 epochs: the loss and
    the weights, as a dict of arrays."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(48, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 4, 48)
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6, 6, 2)),
                                  keras.layers.Conv2D(8, 3, activation="relu", name="conv"),
                                  keras.layers.Flatten(), keras.layers.Dense(4, name="head")])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=True, verbose=0)
    return {"loss": np.asarray(history.history["loss"]),
            **{f"w{i}": w for i, w in enumerate(model.get_weights())}}


PREEMPT_STEPS, PREEMPT_AT = 10, 1


def preemption_batch(step):
    """Global batch ``step`` of the preempted loop (every worker feeds all of it: its one
    replica spans both)."""
    return make_data(GLOBAL_BATCH, seed=step % 3)


def preempted(directory):
    """A custom loop under ``PreemptionCheckpointHandler`` with :func:`make`'s model split
    over both workers (4 cores per replica): worker 1 gets a SIGTERM at step PREEMPT_AT; at
    the agreed step each worker writes its parts and the loop stops (``exit_fn`` instead of
    the exit and relaunch). A new model with other weights and a new handler then restore it
    and train to PREEMPT_STEPS. Returns the step saved at and the final weights."""
    strategy = sx.MultiWorkerMirroredStrategy(
        cores_per_replica=4, layout_map=layout_map(),
        communication_options=sx.CommunicationOptions(timeout_seconds=60))
    saved = []
    config = sx.experimental.TerminationConfig(exit_fn=lambda: saved.append(True))
    for start in range(2):  # the first start is preempted; the second resumes
        with strategy.scope():
            model = make()
            model.optimizer.build(model.trainable_variables)
        if start:  # other weights than the first start's: the restore must replace them all
            model.set_weights([w + 1 for w in model.get_weights()])
        handler = sx.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver, {"model": model, "optimizer": model.optimizer},
            directory, config)
        resumed_at = handler.total_run_calls
        for step in range(handler.total_run_calls, PREEMPT_STEPS):
            if not start and step == PREEMPT_AT and strategy.worker_index == 1:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1.5)  # JAX's notifier looks at its SIGTERM flag once a second
            handler.run(model.train_on_batch, *preemption_batch(step))
            if not start:
                if saved:
                    break
                time.sleep(0.2)  # a step's work: the steps outlast the workers' agreement
    return resumed_at, model.get_weights()


def capped_fit(hidden, budget_fraction):
    """Trains an MLP 10 -> ``hidden`` -> ``hidden`` -> 4 under a memory cap, split over both
    workers (4 cores per replica, Megatron-style), then the same model held whole by this
    process (``MirroredStrategy`` on its 2 devices, the same layout) under the same cap.

    The cap: ``RLIMIT_DATA`` (the private writable memory, where XLA's CPU buffers live) at
    what this process uses now plus ``budget_fraction`` of the whole state, its variables,
    Adam's two slots and the gradients. Prints "capped <budget bytes> held <bytes of state
    this process held> state <bytes of the whole state> loss <first epoch's> <second's>"
    and "control <error>"."""
    variable_bytes = 4 * (10 * hidden + hidden + hidden * hidden + hidden + hidden * 4 + 4)
    budget = int(budget_fraction * 4 * variable_bytes)  # variables, 2 slots, gradients
    x, y = make_data(GLOBAL_BATCH, seed=2)
    layout = keras.distribution.LayoutMap(None)
    layout[".*hidden_a.*kernel"] = (None, "core")
    layout[".*hidden_a.*bias"] = ("core",)
    layout[".*hidden_b.*kernel"] = ("core", None)
    strategies = {
        "capped": sx.MultiWorkerMirroredStrategy(
            cores_per_replica=4, layout_map=layout,
            communication_options=sx.CommunicationOptions(timeout_seconds=60)),
        "control": sx.MirroredStrategy(["cpu:0", "cpu:1"], cores_per_replica=2,
                                       layout_map=layout)}
    for name, strategy in strategies.items():
        gc.collect()
        with open("/proc/self/status") as status:
            used = next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmData:"))
        resource.setrlimit(resource.RLIMIT_DATA, (used + budget, resource.RLIM_INFINITY))
        try:
            keras.utils.set_random_seed(3)
            with strategy.scope():
                model = keras.Sequential([
                    keras.Input((10,)),
                    keras.layers.Dense(hidden, activation="relu", name="hidden_a"),
                    keras.layers.Dense(hidden, activation="relu", name="hidden_b"),
                    keras.layers.Dense(4, name="head")])
                model.compile(optimizer=keras.optimizers.Adam(1e-3),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            loss = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, verbose=0).history["loss"]
            print(name, budget, "held", local_bytes(model), "state",
                  3 * variable_bytes, "loss", *loss, flush=True)
        except Exception as err:  # the test reads which error it was
            print(name, str(err).splitlines()[0][:300], flush=True)
        finally:
            resource.setrlimit(resource.RLIMIT_DATA,
                               (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            model = None


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
    worker = strategy.worker_index
    cnn = sx.MultiWorkerMirroredStrategy(cores_per_replica=2, layout_map=cnn_layout(),
                                         communication_options=options)
    np.savez(os.path.join(sys.argv[1], f"cnn_{worker}.npz"), **run_cnn(cnn))
    resumed_at, weights = preempted(os.path.join(sys.argv[1], "preemption"))
    np.savez(os.path.join(sys.argv[1], f"preempted_{worker}.npz"), *weights,
             resumed_at=resumed_at)
    capped_fit(3072, 0.85)
    print("done", worker, flush=True)
