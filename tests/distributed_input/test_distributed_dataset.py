"""Distributed datasets: order, exactly-once coverage, per-replica splitting, errors."""

import keras
import numpy as np
import pytest

import stratax as sx


def _batches(n_examples, batch):
    x = np.arange(n_examples, dtype=np.int32)
    return [(x[i:i + batch], x[i:i + batch] * 10) for i in range(0, n_examples, batch)]


@pytest.mark.parametrize("replicas", [1, 2, 4, 8])
def test_every_example_seen_exactly_once_per_epoch(replicas):
    strategy = sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])
    dist = strategy.experimental_distribute_dataset(_batches(64, 16))
    for _ in range(2):  # two epochs: the dataset is re-iterated
        seen = []
        for x, y in dist:
            assert isinstance(x, sx.PerReplica) and x.num_replicas == replicas
            parts = strategy.experimental_local_results(x)
            assert all(p.shape == (16 // replicas,) for p in parts)
            seen.extend(int(v) for p in parts for v in np.asarray(p))
            np.testing.assert_array_equal(strategy.gather(y, axis=0),
                                          strategy.gather(x, axis=0) * 10)
        assert seen == list(range(64))


def test_replica_i_gets_rows_i_of_the_global_batch():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2", "cpu:3"])
    (x, _), = list(strategy.experimental_distribute_dataset(_batches(8, 8)))
    local = strategy.experimental_local_results(x)
    assert [list(np.asarray(p)) for p in local] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [d.id for d in (p.devices().pop() for p in (x.stacked.addressable_shards[i].data
                                                       for i in range(4)))] == [0, 1, 2, 3]


def test_dicts_generators_and_pydatasets():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])

    def gen():
        for i in range(3):
            yield {"image": np.full((4, 2), i, np.float32), "label": np.arange(4)}

    batches = list(strategy.experimental_distribute_dataset(gen()))
    assert len(batches) == 3 and set(batches[0]) == {"image", "label"}
    assert strategy.experimental_local_results(batches[2]["image"])[1].shape == (2, 2)

    class Squares(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return np.arange(4, dtype=np.float32) ** 2 + i

    got = [strategy.gather(b, axis=0) for b in strategy.experimental_distribute_dataset(Squares())]
    np.testing.assert_array_equal(got[1], np.arange(4) ** 2 + 1)
    with pytest.raises(TypeError, match="iterable of batches"):
        list(strategy.experimental_distribute_dataset(42))


def test_distribute_datasets_from_function_gets_input_context():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2", "cpu:3"])
    contexts = []

    def dataset_fn(ctx: sx.InputContext):
        contexts.append(ctx)
        per_replica = ctx.get_per_replica_batch_size(8)
        x = np.arange(32, dtype=np.float32)
        return [x[i:i + per_replica] for i in range(0, 32, per_replica)]

    steps = list(strategy.distribute_datasets_from_function(dataset_fn))
    assert contexts == [sx.InputContext(1, 0, 4)]
    assert len(steps) == 4
    np.testing.assert_array_equal(strategy.gather(steps[1], axis=0), np.arange(8, 16))
    with pytest.raises(ValueError, match="does not split over 4 replicas"):
        contexts[0].get_per_replica_batch_size(10)


def test_iterator_get_next_and_optional():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    iterator = iter(strategy.experimental_distribute_dataset(_batches(4, 4)))
    assert iterator.get_next() is not None
    assert iterator.get_next_as_optional() is None
    with pytest.raises(StopIteration):
        iterator.get_next()


def test_input_options_validation():
    assert sx.InputOptions(auto_shard_policy="off").auto_shard_policy is sx.AutoShardPolicy.OFF
    with pytest.raises(ValueError, match="PER_WORKER"):
        sx.InputOptions(experimental_replication_mode="PER_REPLICA")
    with pytest.raises(ValueError, match=">= 0"):
        sx.InputOptions(experimental_prefetch_to_device=-1)
