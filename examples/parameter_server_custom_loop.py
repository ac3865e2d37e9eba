"""TensorFlow's "Parameter server training" guide, custom-loop part, ported to stratax.

A click-through-rate style model: each example is a bag of feature ids looked up in an
embedding table (partitioned over the parameter servers), averaged, and fed to a small dense
head. Run on one box with

    stratax launch --workers 2 --ps 2 examples/parameter_server_custom_loop.py

(every task runs this same file: on `worker` and `ps` tasks the strategy serves and exits when
the chief is done). The embedding is read row-sparse: each step pulls only the rows its batch
looks up and pushes only their gradients.
"""

import argparse

import jax
import jax.numpy as jnp
import keras
import numpy as np

import stratax as sx

VOCAB, DIM, IDS_PER_EXAMPLE, BATCH = 10_000, 16, 8, 64


def dataset_fn(input_context):
    """Runs on each worker (sent by name): an endless stream of its own batches."""
    rng = np.random.default_rng(input_context.input_pipeline_id)
    liked = np.arange(VOCAB) % 7 == 0  # the hidden rule the model learns
    while True:
        ids = rng.integers(0, VOCAB, size=(BATCH, IDS_PER_EXAMPLE)).astype(np.int32)
        labels = (liked[ids].sum(axis=1, keepdims=True) >= 2).astype(np.float32)
        yield ids, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()

    strategy = sx.ParameterServerStrategy(
        sx.cluster_resolver.TFConfigClusterResolver(),
        variable_partitioner=sx.partitioners.MinSizePartitioner(min_shard_bytes=64 << 10,
                                                                max_shards=2))
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    rng = np.random.default_rng(0)
    with strategy.scope():
        table = strategy.create_variable(
            rng.normal(scale=0.05, size=(VOCAB, DIM)).astype(np.float32), name="embedding")
        head = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.01)
    loss_obj = keras.losses.BinaryCrossentropy(from_logits=True)

    def replica_fn(ids, labels):
        rows, positions = strategy.read_rows(table, ids)

        def loss_fn(rows, head_weights):
            features = jnp.take(rows, positions, axis=0).mean(axis=1)
            logits, _ = head.stateless_call(head_weights, [], features)
            accuracy = jnp.mean((logits > 0) == (labels > 0.5))
            return loss_obj(labels, logits), accuracy

        (loss, accuracy), (row_grads, head_grads) = jax.value_and_grad(
            loss_fn, argnums=(0, 1), has_aux=True)(rows, strategy.read(head.trainable_variables))
        strategy.apply_gradients(
            [(row_grads, table), *zip(head_grads, head.trainable_variables, strict=False)],
            optimizer)
        return loss, accuracy

    def step_fn(iterator):
        return strategy.run(replica_fn, args=next(iterator))

    print(strategy.describe_variables())
    per_worker_iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    results = [coordinator.schedule(step_fn, args=(per_worker_iterator,))
               for _ in range(args.steps)]
    coordinator.join()
    losses = [float(r.fetch()[0]) for r in results]
    accuracy = float(np.mean([r.fetch()[1] for r in results[-20:]]))
    print(f"loss {np.mean(losses[:20]):.4f} -> {np.mean(losses[-20:]):.4f}, "
          f"accuracy (last 20 steps) {accuracy:.3f}")
    strategy.refresh_keras_variables()
    print("steps per worker:", {w: s["steps"] for w, s in coordinator.stats().items()})


if __name__ == "__main__":
    main()
