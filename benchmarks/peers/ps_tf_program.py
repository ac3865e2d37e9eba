"""TensorFlow's ParameterServerStrategy on the workloads of ``ps_program.py`` (the peer).

Runs in the TensorFlow virtual environment (``benchmarks/.venvs/tf-cpu``) with tf-keras
(Keras 2: ``TF_USE_LEGACY_KERAS=1``), one process per task with TF_CONFIG, as
``benchmarks/workloads/ps.py`` starts it. Worker and ps tasks run
``tf.distribute.Server(...).join()`` (they never return: the launcher ends them once the chief is
done). The chief is the TF guide's custom loop: ``ClusterCoordinator``,
``create_per_worker_dataset``, a ``tf.function`` ``step_fn`` running ``strategy.run`` ``steps per
call`` times, ``schedule``/``join``.

argv: workload (mlp_adam | emb_sgd | emb_lazy_adam | emb_dense_adam), steps per scheduled call,
number of timed calls. ``emb_lazy_adam`` and ``emb_dense_adam`` are the same program here:
tf-keras' Adam has one semantics for an embedding's sparse gradient (it decays both moments
of every row each step and scatters the touched rows). The chief prints ``RESULT {json}``.
"""

import json
import os
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

BATCH, IDS_PER_EXAMPLE, VOCAB, DIM = 256, 20, 100_000, 64


def mlp_data():
    rng = np.random.default_rng(0)  # TF calls dataset_fn without an input context
    x = rng.normal(size=(BATCH, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(BATCH,)).astype(np.int32)
    return tf.data.Dataset.from_tensors((x, y)).repeat()


def embedding_data():
    rng = np.random.default_rng(0)  # TF calls dataset_fn without an input context
    ids = rng.integers(0, VOCAB, size=(16, BATCH, IDS_PER_EXAMPLE)).astype(np.int32)
    y = rng.normal(size=(16, BATCH, 1)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((ids, y)).repeat()


def serve(resolver):
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    server.join()


def main():
    workload, spe, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        serve(resolver)
        return
    import tf_keras as keras

    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    rng = np.random.default_rng(0)
    with strategy.scope():
        if workload == "mlp_adam":
            model = keras.Sequential([keras.Input((784,)),
                                      keras.layers.Dense(128, activation="relu"),
                                      keras.layers.Dense(10)])
            variables = model.trainable_variables
            optimizer = keras.optimizers.Adam(1e-3)
            loss_obj = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=keras.losses.Reduction.NONE)

            def loss_fn(x, y):
                return tf.reduce_mean(loss_obj(y, model(x, training=True)))

            dataset_fn = mlp_data
        else:
            table = tf.Variable(rng.normal(scale=0.05, size=(VOCAB, DIM)).astype(np.float32),
                                name="embedding")
            dense = [tf.Variable(rng.normal(scale=0.1, size=s).astype(np.float32), name=n)
                     for n, s in [("d1_kernel", (DIM, 64)), ("d1_bias", (64,)),
                                  ("d2_kernel", (64, 1)), ("d2_bias", (1,))]]
            variables = [table, *dense]
            optimizer = (keras.optimizers.SGD(0.01) if workload == "emb_sgd"
                         else keras.optimizers.Adam(1e-3))

            def loss_fn(ids, y):
                k1, b1, k2, b2 = dense
                h = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
                h = tf.nn.relu(h @ k1 + b1)
                return tf.reduce_mean((h @ k2 + b2 - y) ** 2)

            dataset_fn = embedding_data
        optimizer.build(variables)

    def replica_fn(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(*batch)
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        return loss

    @tf.function
    def step_fn(iterator):
        loss = tf.constant(0.0)
        for _ in range(spe):
            loss = strategy.run(replica_fn, args=(next(iterator),))
        return loss

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    for _ in range(4):  # warm-up: trace and start every worker
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()
    start = time.perf_counter()
    losses = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(calls)]
    coordinator.join()
    wall = time.perf_counter() - start
    steps = calls * spe
    print("RESULT " + json.dumps({"workload": workload, "spe": spe, "steps": steps, "wall": wall,
                                  "steps_per_s": steps / wall,
                                  "last_loss": float(losses[-1].fetch())}), flush=True)


if __name__ == "__main__":
    main()
