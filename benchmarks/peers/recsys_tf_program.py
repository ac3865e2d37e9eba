"""TensorFlow's ParameterServerStrategy in ``benchmarks.workloads.recsys`` (the anchor): the same
DLRM model (``recsys_model.build`` with tf-keras) trained with ``model.fit``.

Runs in the TensorFlow virtual environment (``benchmarks/.venvs/tf-cpu``, tf-keras through
``TF_USE_LEGACY_KERAS=1``), one process per task with TF_CONFIG; worker and ps tasks serve
(``ps_tf_program.serve``: they never return, the launcher ends them). The chief builds the model
under the strategy with the partitioner stratax's program uses, and trains from a
``DatasetCreator``: each worker reads its shard of the training set from a flat binary copy of
it (``FixedLengthRecordDataset``, so the data never travel inside the graph). Like stratax's
program it fits the warm-up batches, then the whole training set (timed, same number of
steps), and scores the held-out set; tf-keras' ``predict`` does not run under this strategy, so
the chief copies the trained weights into the same model built outside it and predicts there.

argv: the data directory, a JSON of options (``batch``, ``warm_steps``, ``spe``). The chief
prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import types
from pathlib import Path
from typing import Any

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from benchmarks.peers.ps_tf_program import serve
from benchmarks.workloads import recsys_data, recsys_model

# ``keras.ops``' signatures over TensorFlow, for ``recsys_model.build``.
TF_OPS = types.SimpleNamespace(
    stack=tf.stack, matmul=tf.matmul, reshape=tf.reshape, concatenate=tf.concat,
    transpose=lambda x, axes: tf.transpose(x, perm=axes),
    take=lambda x, indices, axis: tf.gather(x, indices, axis=axis))
RECORD_COLUMNS = recsys_data.DENSE + recsys_data.CATEGORICAL + 1


def records(root: Path) -> Path:
    """The training set as one flat file of float32 records (13 dense values, the 26 ids'
    int32 bits, the label), written once next to the ``.npy`` files."""
    path = root / "train.records"
    if not path.exists():
        split = recsys_data.load(root, "train")
        table = np.concatenate([split["dense"], split["ids"].view(np.float32), split["labels"]],
                               axis=1)
        table.astype(np.float32).tofile(path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return path


def make_dataset_fn(path: Path, batch: int):
    """Each worker's input: its shard of the records, in order, batched, repeated."""
    dense, ids = recsys_data.DENSE, recsys_data.CATEGORICAL

    def decode(raw: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        values = tf.reshape(tf.io.decode_raw(raw, tf.float32), (-1, RECORD_COLUMNS))
        return ({"dense": values[:, :dense],
                 "ids": tf.bitcast(values[:, dense:dense + ids], tf.int32)},
                values[:, dense + ids:])

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        return (tf.data.FixedLengthRecordDataset(str(path), RECORD_COLUMNS * 4)
                .shard(context.num_input_pipelines, context.input_pipeline_id)
                .batch(batch, drop_remainder=True).map(decode).repeat().prefetch(2))

    return dataset_fn


def train(root: Path, options: dict[str, Any]) -> None:
    """Trains and scores the model under TF's ParameterServerStrategy; prints the result."""
    import tf_keras as keras

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=256 << 10, max_shards=2))
    sizes, batch = recsys_data.table_sizes(root), options["batch"]
    with strategy.scope():
        model = recsys_model.build(keras, TF_OPS, sizes)
        checksum = recsys_model.set_initial_weights(model)
        model.compile(**recsys_model.compile_args(keras), steps_per_execution=options["spe"])
    data = keras.utils.experimental.DatasetCreator(make_dataset_fn(records(root), batch))
    model.fit(data, epochs=1, steps_per_epoch=options["warm_steps"], verbose=0)
    examples = len(np.load(root / "train_labels.npy", mmap_mode="r"))
    steps = examples // batch
    start = time.perf_counter()
    history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
    wall = time.perf_counter() - start
    local = recsys_model.build(keras, TF_OPS, sizes)
    for trained, copy in zip(model.layers, local.layers, strict=True):
        weights = trained.get_weights()
        if len(weights) != len(copy.weights):  # a partitioned table: its shards, in row order
            weights = [np.concatenate(weights, axis=0)]
        copy.set_weights(weights)
    held_out = recsys_data.load(root, "held_out")
    scores = local.predict({"dense": held_out["dense"], "ids": held_out["ids"]},
                           batch_size=4096, verbose=0)
    print("RESULT " + json.dumps({
        "system": "tf-ps", "examples": (steps + options["warm_steps"]) * batch,
        "timed_examples": steps * batch, "steps": steps, "wall_s": wall,
        "examples_per_s": steps * batch / wall, "train_loss": float(history.history["loss"][-1]),
        "weights_checksum": checksum, "process": 0,
        "auc": recsys_data.auc(held_out["labels"], scores),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


if __name__ == "__main__":
    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if cluster.task_type in ("worker", "ps"):
        serve(cluster)
    else:
        train(Path(sys.argv[1]), json.loads(sys.argv[2]))
