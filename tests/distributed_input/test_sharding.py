"""How the workers share a tf.data or grain pipeline (``distributed_input.sharding``), alone.

The 2-worker runs are in tests/multiprocess/test_input_matrix.py; here each worker's view is
built directly with ``shard_for_process(..., num_processes=2, rank=r)``.
"""

import grain
import numpy as np
import pytest
import tensorflow as tf

from stratax._src.distributed_input.input_context import AutoShardPolicy
from stratax._src.distributed_input.sharding import shard_for_process


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


# Stand-ins for torch's classes, recognised as Keras recognises a torch DataLoader: by class
# name and module (torch is not a test dependency; stratax never imports it).
class _TorchClass:
    pass


def _torch_class(name, module, **attributes):
    return type(name, (_TorchClass,), {"__module__": module, **attributes})


DataLoader = _torch_class("DataLoader", "torch.utils.data.dataloader")
DistributedSampler = _torch_class("DistributedSampler", "torch.utils.data.distributed")
RandomSampler = _torch_class("RandomSampler", "torch.utils.data.sampler")
BatchSampler = _torch_class("BatchSampler", "torch.utils.data.sampler")


def _sampler(cls, **attributes):
    sampler = cls()
    sampler.__dict__.update(attributes)
    return sampler


def _loader(sampler, in_batch_sampler=False):
    loader = DataLoader()
    if in_batch_sampler:  # DataLoader(batch_sampler=BatchSampler(sampler, 8, False))
        loader.sampler = _sampler(RandomSampler)
        loader.batch_sampler = _sampler(BatchSampler, sampler=sampler)
    else:  # DataLoader(dataset, batch_size=8, sampler=sampler)
        loader.sampler = sampler
        loader.batch_sampler = _sampler(BatchSampler, sampler=sampler)
    return loader


@pytest.mark.parametrize("in_batch_sampler", [False, True])
def test_a_torch_loader_with_a_distributed_sampler_is_the_workers_part(in_batch_sampler):
    """Issue 49 #2: its batches were taken as global ones and cut again (half skipped)."""
    for rank in (0, 1):
        loader = _loader(_sampler(DistributedSampler, num_replicas=2, rank=rank),
                         in_batch_sampler)
        assert shard_for_process(loader, AutoShardPolicy.AUTO, 2, rank) == (loader, True)
    plain = _loader(_sampler(RandomSampler))
    assert shard_for_process(plain, AutoShardPolicy.AUTO, 2, 1) == (plain, False)


@pytest.mark.parametrize(
    "replicas, its_rank, processes, rank",
    [(2, 0, 2, 1), (4, 1, 2, 1), (2, 0, 1, 0)],
)
def test_a_distributed_sampler_of_another_shard_is_a_clear_error(replicas, its_rank,
                                                                  processes, rank):
    loader = _loader(_sampler(DistributedSampler, num_replicas=replicas, rank=its_rank))
    with pytest.raises(ValueError, match=(
            rf"DistributedSampler reads shard {its_rank} of {replicas}, but this is process "
            rf"{rank} of {processes}.*num_replicas=jax.process_count\(\), "
            r"rank=jax.process_index\(\)")):
        shard_for_process(loader, AutoShardPolicy.AUTO, processes, rank)


def test_a_one_replica_sampler_in_one_process_reads_everything():
    loader = _loader(_sampler(DistributedSampler, num_replicas=1, rank=0))
    assert shard_for_process(loader, AutoShardPolicy.AUTO, 1, 0) == (loader, False)
