"""How the workers share a tf.data or grain pipeline (stratax._src.data.sharding), in one process.

The 2-worker runs are in tests/multiprocess/test_input_matrix.py; here each worker's view is
built directly with ``shard_for_process(..., num_processes=2, rank=r)``.
"""

import grain
import numpy as np
import pytest
import tensorflow as tf

from stratax._src.data.input_context import AutoShardPolicy
from stratax._src.data.sharding import shard_for_process


def _csv_files(tmp_path, files=4, rows=6):
    for part in range(files):
        (tmp_path / f"part{part}.csv").write_text(
            "".join(f"{part * rows + r}\n" for r in range(rows)))
    return sorted(str(p) for p in tmp_path.glob("*.csv"))


def _ids(dataset):
    return [batch.numpy().astype(int).tolist() for batch in dataset]


def _over_files(files, policy=None):
    dataset = tf.data.TextLineDataset(files).map(
        lambda line: tf.strings.to_number(line, tf.int32)).batch(4)
    if policy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = policy
        dataset = dataset.with_options(options)
    return dataset


@pytest.mark.parametrize("policy", [None, tf.data.experimental.AutoShardPolicy.FILE])
def test_files_go_to_their_worker_rebatched_into_its_part(tmp_path, policy):
    files = _csv_files(tmp_path)
    for rank in (0, 1):
        mine, per_process = shard_for_process(_over_files(files, policy), AutoShardPolicy.AUTO,
                                              2, rank)
        assert per_process
        batches = _ids(mine)
        assert {i // 6 for batch in batches for i in batch} == {rank, rank + 2}
        assert [len(b) for b in batches] == [2] * 6  # half of each global batch of 4


def test_in_memory_data_is_shared_by_rows_not_sharded_at_the_source():
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(12)).batch(4)
    same, per_process = shard_for_process(dataset, AutoShardPolicy.AUTO, 2, 1)
    assert same is dataset and not per_process  # every worker reads it, keeps its rows


def test_off_and_data_policies(tmp_path):
    files = _csv_files(tmp_path)
    off = _over_files(files, tf.data.experimental.AutoShardPolicy.OFF)
    assert shard_for_process(off, AutoShardPolicy.AUTO, 2, 0) == (off, True)
    data = _over_files(files, tf.data.experimental.AutoShardPolicy.DATA)
    assert shard_for_process(data, AutoShardPolicy.AUTO, 2, 0) == (data, False)
    # InputOptions' policy, when it says more than AUTO, decides.
    assert shard_for_process(data, AutoShardPolicy.OFF, 2, 0) == (data, True)


def test_file_policy_without_files_is_a_clear_error():
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(8)).batch(4).with_options(options)
    with pytest.raises(ValueError, match="FILE, but it reads no files"):
        shard_for_process(dataset, AutoShardPolicy.AUTO, 2, 0)


def test_one_process_reads_everything(tmp_path):
    dataset = _over_files(_csv_files(tmp_path))
    assert shard_for_process(dataset, AutoShardPolicy.AUTO, 1, 0) == (dataset, False)


def test_a_sharded_grain_loader_is_the_workers_part():
    def loader(shard_options):
        return grain.DataLoader(
            data_source=list(range(16)), operations=[grain.transforms.Batch(4)], worker_count=0,
            sampler=grain.samplers.IndexSampler(16, shard_options=shard_options, num_epochs=1))

    sharded = loader(grain.sharding.ShardOptions(shard_index=1, shard_count=2))
    assert shard_for_process(sharded, AutoShardPolicy.AUTO, 2, 1) == (sharded, True)
    whole = loader(grain.sharding.NoSharding())
    assert shard_for_process(whole, AutoShardPolicy.AUTO, 2, 1) == (whole, False)
