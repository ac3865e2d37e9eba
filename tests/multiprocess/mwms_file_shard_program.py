"""Trains on a ``tf.data`` pipeline over CSV files on each worker of a MultiWorkerMirroredStrategy.

Usage: python mwms_file_shard_program.py DATA_DIR OUT_DIR. The pipeline keeps TensorFlow's
default ``AUTO`` policy, which shards it by file. Writes OUT_DIR/worker_<i>.npz: the ids of the
rows each of its batches held, the final weights and the loss history.
"""

import glob
import os
import sys

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from input_matrix import GLOBAL_BATCH, make_model  # noqa: E402

from stratax._src.data import sharding  # noqa: E402
from stratax._src.data.input_context import AutoShardPolicy  # noqa: E402

data_dir, out_dir = sys.argv[1:3]


def parse(line):
    row_id, *features, label = tf.io.decode_csv(line, [[0.0]] * 8)
    return tf.stack(features, axis=-1), label, row_id


def pipeline(with_ids):
    files = sorted(glob.glob(os.path.join(data_dir, "*.csv")))
    dataset = tf.data.TextLineDataset(files).map(parse)
    if not with_ids:
        dataset = dataset.map(lambda x, y, row_id: (x, y))
    return dataset.batch(GLOBAL_BATCH)


mine, per_process = sharding.shard_for_process(
    pipeline(with_ids=True), AutoShardPolicy.AUTO, strategy.num_processes, strategy.process_rank)
assert per_process
ids = [batch[2].numpy().astype(np.int64) for batch in mine]
model = make_model(strategy)
history = model.fit(pipeline(with_ids=False), epochs=2, verbose=0)
np.savez(os.path.join(out_dir, f"worker_{strategy.worker_index}.npz"),
         ids=np.stack(ids), loss=np.asarray(history.history["loss"]),
         **{f"w{i}": w for i, w in enumerate(model.get_weights())})
print("done", strategy.worker_index, flush=True)
