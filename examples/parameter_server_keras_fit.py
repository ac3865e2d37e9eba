"""TensorFlow's "Parameter server training" guide, Keras `fit` part, ported to stratax.

The guide's model (Embedding -> LSTM -> Dense, Adam, `steps_per_execution=10`) trained with
`model.fit` on a chief + workers + parameter servers. Run on one box with

    stratax launch --workers 2 --ps 2 examples/parameter_server_keras_fit.py

(every task runs this same file: on `worker` and `ps` tasks the strategy serves and exits when
the chief is done). `--input arrays` ships numpy arrays to the workers once; `--input creator`
(the default, as in the guide) builds each worker's data there with the guide's `dataset_fn`,
a `tf.data` pipeline sharded by `input_context` and batched per replica.
"""

import argparse

import stratax as sx  # added; import it before tensorflow and keras

import keras  # isort: skip  (added: tf.keras -> keras)
import numpy as np  # isort: skip
import tensorflow as tf  # isort: skip  (the guide's input pipeline, built on each worker)

VOCAB, SEQ, BATCH = 1000, 5, 64


def make_batch(rng, rows=BATCH):
    """Sequences of token ids; the label is the last token mod 10."""
    x = rng.integers(0, VOCAB, size=(rows, SEQ)).astype(np.int32)
    return x, (x[:, -1] % 10).astype(np.int32)


def dataset_fn(input_context):
    """Runs on each worker (sent by name): the guide's pipeline over this worker's examples."""
    global_batch_size = BATCH
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    x, y = make_batch(np.random.default_rng(0), rows=4096)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    dataset = dataset.prefetch(2)
    return dataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--input", choices=("creator", "arrays"), default="creator")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100, help="steps per epoch")
    args = parser.parse_args()

    strategy = sx.ParameterServerStrategy(
        sx.cluster_resolver.TFConfigClusterResolver(),
        variable_partitioner=sx.partitioners.MinSizePartitioner(min_shard_bytes=64 << 10,
                                                                max_shards=2))
    with strategy.scope():
        model = keras.Sequential([keras.layers.Embedding(VOCAB, 64), keras.layers.LSTM(64),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam", metrics=["accuracy"], steps_per_execution=10,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if args.input == "creator":
        history = model.fit(sx.DatasetCreator(dataset_fn), epochs=args.epochs,
                            steps_per_epoch=args.steps, verbose=2)
    else:
        rng = np.random.default_rng(0)
        batches = [make_batch(rng) for _ in range(args.steps)]
        x, y = (np.concatenate(parts) for parts in zip(*batches, strict=True))
        history = model.fit(x, y, batch_size=BATCH, epochs=args.epochs, verbose=2)
    x_test, y_test = make_batch(np.random.default_rng(99))
    _, accuracy = model.evaluate(x_test, y_test, batch_size=BATCH, verbose=0)
    print(strategy.describe_variables())
    print(f"loss {history.history['loss'][0]:.3f} -> {history.history['loss'][-1]:.3f}; "
          f"held-out accuracy {accuracy:.3f}; optimizer.iterations "
          f"{int(model.optimizer.iterations.numpy())}")
    model.save_weights("/tmp/parameter_server_keras_fit.weights.h5")


if __name__ == "__main__":
    main()
