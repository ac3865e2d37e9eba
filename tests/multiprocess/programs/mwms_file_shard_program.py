"""Trains on pipelines that each worker reads a shard of, on a MultiWorkerMirroredStrategy.

Usage: python mwms_file_shard_program.py DATA_DIR OUT_DIR. First a ``tf.data`` pipeline over the
CSV files of DATA_DIR with TensorFlow's default ``AUTO`` policy, which shards it by file; then a
grain ``DataLoader`` sharded with ``ShardByJaxProcess`` over ``make_data(96)``. Writes
OUT_DIR/{files,grain}_<i>.npz: the ids of the rows each of its batches held, the final weights
and the loss history.
"""

import glob
import os
import sys

import stratax as sx

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import grain  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from input_matrix import GLOBAL_BATCH, make_data, make_model  # noqa: E402

from stratax._src.distributed_input import sharding  # noqa: E402
from stratax._src.distributed_input.input_context import AutoShardPolicy  # noqa: E402

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


def grain_loader(records):
    """This worker's records (grain's contiguous shard), in its part of each global batch."""
    return grain.DataLoader(
        data_source=records, worker_count=0,
        sampler=grain.samplers.IndexSampler(
            len(records), num_epochs=1,
            shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=True)),
        operations=[grain.transforms.Batch(GLOBAL_BATCH // strategy.num_processes)])


def train(name, data, ids):
    model = make_model(strategy)
    history = model.fit(data, epochs=2, verbose=0)
    np.savez(os.path.join(out_dir, f"{name}_{strategy.worker_index}.npz"),
             ids=np.stack(ids), loss=np.asarray(history.history["loss"]),
             **{f"w{i}": w for i, w in enumerate(model.get_weights())})


mine, per_process = sharding.shard_for_process(
    pipeline(with_ids=True), AutoShardPolicy.AUTO, strategy.num_processes, strategy.process_rank)
assert per_process
train("files", pipeline(with_ids=False),
      [batch[2].numpy().astype(np.int64) for batch in mine])
x, y = make_data(n=96)
train("grain", grain_loader(list(zip(x, y, strict=True))), list(grain_loader(list(range(96)))))
print("done", strategy.worker_index, flush=True)
