"""Uneven batches in custom loops: TensorFlow's split, padded and masked, exact sums."""

import jax.numpy as jnp
import numpy as np
import pytest

import stratax as sx


def _strategy(n):
    return sx.MirroredStrategy([f"cpu:{i}" for i in range(n)])


def _global_batches(n_examples, batch):
    x = np.arange(n_examples, dtype=np.float32)
    return [x[i:i + batch] for i in range(0, n_examples, batch)]


def _per_replica_fn(n_examples, per_replica):
    """A dataset_fn for distribute_datasets_from_function: per-replica batches of arange."""
    return lambda ctx: _global_batches(n_examples, per_replica)


def _local(strategy, value):
    return [np.asarray(p).tolist() for p in strategy.experimental_local_results(value)]


def test_global_batches_split_like_tensorflow():
    """Measured on TensorFlow 2.21 with 4 replicas: chunks of ceil(rows / 4) in replica order."""
    strategy = _strategy(4)
    steps = [_local(strategy, b)
             for b in strategy.experimental_distribute_dataset(_global_batches(22, 8))]
    assert steps == [[[0, 1], [2, 3], [4, 5], [6, 7]],
                     [[8, 9], [10, 11], [12, 13], [14, 15]],
                     [[16, 17], [18, 19], [20, 21], []]]
    (_, last), = [list(strategy.experimental_distribute_dataset(_global_batches(10, 8)))]
    assert _local(strategy, last) == [[8], [9], [], []]
    assert last.valid_rows == (1, 1, 0, 0) and last.stacked.shape == (4, 1)
    three = _strategy(3)
    (batch,) = three.experimental_distribute_dataset(_global_batches(16, 16))
    assert [len(p) for p in _local(three, batch)] == [6, 6, 4]


def test_datasets_from_function_keep_the_trailing_partial_step():
    """TensorFlow's testUnevenDatasetBatches: range(9).batch(2) over 2 replicas."""
    strategy = _strategy(2)
    dist = strategy.distribute_datasets_from_function(_per_replica_fn(9, 2))
    steps = [_local(strategy, step) for step in dist]
    assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], []]]


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("n_examples,batch", [(64, 16), (70, 16), (5, 8)])
@pytest.mark.parametrize("api", ["distribute_dataset", "from_function"])
def test_sums_and_gathers_are_exact(n, n_examples, batch, api):
    strategy = _strategy(n)
    if api == "distribute_dataset":
        dist = strategy.experimental_distribute_dataset(_global_batches(n_examples, batch))
    else:
        dist = strategy.distribute_datasets_from_function(_per_replica_fn(n_examples, batch))

    def step(x):
        ctx = sx.get_replica_context()
        return ctx.all_reduce("sum", jnp.sum(x)), ctx.all_reduce("sum", ctx.num_valid_rows)

    total, rows, gathered = 0.0, 0, []
    for x in dist:
        summed, count = strategy.run(step, args=(x,))
        total += float(summed)
        rows += int(count)
        gathered.extend(np.asarray(strategy.gather(x, axis=0)).tolist())
        assert float(strategy.reduce("sum", x, axis=0)) == float(summed)
    expected = np.arange(n_examples, dtype=np.float32)
    assert total == expected.sum() and rows == n_examples
    assert gathered == expected.tolist()  # every example once, in order, no padding


@pytest.mark.parametrize("explicit", [False, True])
def test_compute_average_loss_ignores_padding_rows(explicit):
    strategy = _strategy(4)
    (last,) = strategy.experimental_distribute_dataset([np.arange(6, dtype=np.float32)])
    assert last.valid_rows == (2, 2, 2, 0)

    def step(x):
        per_example = (x + 1.0) ** 2  # non-zero on the zero padding rows too
        gbs = 8 if explicit else None
        return sx.compute_average_loss(per_example, global_batch_size=gbs)

    loss = strategy.reduce("sum", strategy.run(step, args=(last,)), axis=None)
    real = ((np.arange(6) + 1.0) ** 2).sum()
    assert float(loss) == pytest.approx(real / (8 if explicit else 6))


def test_replica_context_exposes_the_valid_rows():
    strategy = _strategy(4)
    (batch,) = strategy.experimental_distribute_dataset([np.arange(5, dtype=np.float32) + 1])

    def step(x):
        ctx = sx.get_replica_context()
        masked_max = jnp.max(jnp.where(ctx.valid_mask, x, -1.0))
        return ctx.num_valid_rows, ctx.global_num_valid_rows, ctx.valid_mask, masked_max

    valid, total, mask, masked_max = strategy.run(step, args=(batch,))
    assert [int(v) for v in strategy.experimental_local_results(valid)] == [2, 2, 1, 0]
    assert int(total) == 5
    assert np.asarray(mask.stacked).tolist() == [[True, True], [True, True], [True, False],
                                                 [False, False]]
    assert [float(m) for m in strategy.experimental_local_results(masked_max)] == [2, 4, 5, -1]
    # Without a distributed batch there is nothing to mask.
    assert bool(strategy.run(lambda: sx.get_replica_context().valid_mask is None))


def test_per_example_outputs_of_an_uneven_batch_gather_to_real_rows():
    strategy = _strategy(4)
    data = np.arange(10, dtype=np.float32).reshape(5, 2)
    (batch,) = strategy.experimental_distribute_dataset([data])
    predictions = strategy.run(lambda x: x.sum(axis=1) + 1.0, args=(batch,))
    np.testing.assert_array_equal(strategy.gather(predictions, axis=0), data.sum(axis=1) + 1)
    assert [len(p) for p in strategy.experimental_local_results(predictions)] == [2, 2, 1, 0]
    np.testing.assert_allclose(strategy.reduce("mean", predictions, axis=0),
                               (data.sum(axis=1) + 1).mean())


def test_uneven_components_cannot_combine_along_other_axes():
    strategy = _strategy(4)
    (batch,) = strategy.experimental_distribute_dataset([np.ones((6, 3), np.float32)])
    for call in (lambda: strategy.reduce("sum", batch, axis=None),
                 lambda: strategy.gather(batch, axis=1)):
        with pytest.raises(ValueError, match=r"replica 2: \(2, 3\), replica 3: \(0, 3\)"):
            call()
    np.testing.assert_array_equal(strategy.reduce("sum", batch, axis=0), [6.0, 6.0, 6.0])


def test_values_of_different_shapes_are_a_clear_error():
    strategy = _strategy(2)
    with pytest.raises(ValueError, match=r"replica 0: \(1,\), replica 1: \(2,\).*one shape"):
        strategy.experimental_distribute_values_from_function(
            lambda ctx: np.zeros(ctx.replica_id_in_sync_group + 1))
    steps = strategy.distribute_datasets_from_function(
        lambda ctx: [np.zeros((2, 3)), np.zeros((2, 4))])
    with pytest.raises(ValueError, match=r"beyond the batch axis \(replica 0: \(3,\), replica 1"):
        list(steps)


def test_batch_elements_with_different_row_counts_are_a_clear_error():
    strategy = _strategy(2)
    dist = strategy.experimental_distribute_dataset([(np.zeros(4), np.zeros(3))])
    with pytest.raises(ValueError, match=r"different batch sizes \[3, 4\]"):
        list(dist)
