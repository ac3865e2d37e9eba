"""A recommender whose embedding table no machine holds whole: train, checkpoint, serve.

Run on one box with

    stratax launch --workers 2 --ps 2 examples/parameter_server_large_table.py --rows 4000000

(every task runs this file; worker and ps tasks serve inside the strategy). The table
(``--rows`` x 16 float32: 244 MiB at 4M rows, any size the servers hold together) is built by
its parameter servers, shard by shard, from its initializer: the chief never holds it. Keras
``fit`` trains it row-sparse, ``strategy.save_checkpoint(directory)`` has every server write
its own shards, and ``sx.serving.for_serving`` turns the model into one for inference that
reads only the rows it looks up from that checkpoint; it is saved as a small ``.keras`` file
and loaded back as any Keras model.
"""

import argparse
import os
import tempfile

import stratax as sx  # import it before keras

import keras  # isort: skip
import numpy as np  # isort: skip

DIM, IDS, BATCH = 16, 8, 256


def dataset_fn(input_context):
    """Runs on each worker (sent by name): item ids, most of them from a thousand popular
    items spread over the whole table, as in a recommender's logs; the label is whether the
    first item's id is even."""
    rng = np.random.default_rng(input_context.input_pipeline_id)
    rows = int(os.environ["EXAMPLE_ROWS"])
    popular = np.arange(0, rows, rows // 1000 | 1, dtype=np.int32)  # odd: both parities
    while True:
        ids = np.where(rng.random((BATCH, IDS)) < 0.9, rng.choice(popular, (BATCH, IDS)),
                       rng.integers(0, rows, size=(BATCH, IDS))).astype(np.int32)
        yield ids, (ids[:, :1] % 2 == 0).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "large_table"))
    args = parser.parse_args()
    os.environ["EXAMPLE_ROWS"] = str(args.rows)  # read by dataset_fn on the workers too

    strategy = sx.ParameterServerStrategy(
        variable_partitioner=sx.partitioners.FixedShardsPartitioner(num_shards=2))
    with strategy.scope():
        ids = keras.Input((IDS,), dtype="int32")
        rows = keras.layers.Embedding(args.rows, DIM)(ids)
        hidden = keras.layers.Dense(32, activation="relu")(
            keras.layers.GlobalAveragePooling1D()(rows))
        model = keras.Model(ids, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True))
    print(strategy.describe_variables(), flush=True)
    history = model.fit(sx.DatasetCreator(dataset_fn), epochs=2,
                        steps_per_epoch=args.steps // 2, verbose=0)
    print(f"loss {history.history['loss'][0]:.4f} -> {history.history['loss'][-1]:.4f}")

    checkpoint = os.path.join(args.out, "checkpoint")
    strategy.save_checkpoint(checkpoint)          # each ps writes its own shards
    served = sx.serving.for_serving(model, checkpoint)
    served.save(os.path.join(args.out, "served.keras"))
    loaded = keras.models.load_model(os.path.join(args.out, "served.keras"))
    probe = np.arange(2 * IDS, dtype=np.int32).reshape(2, IDS) * (args.rows // (2 * IDS))
    print("served predictions equal the trained model's:",
          np.allclose(loaded.predict(probe, verbose=0), model.predict(probe, verbose=0),
                      atol=1e-5))


if __name__ == "__main__":
    main()
