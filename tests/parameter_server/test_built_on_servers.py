"""Keras variables built by their parameter servers (``ps_build_on_servers_bytes``): the chief
never holds them, ``fit``/``evaluate``/``predict`` run, reads that would need the whole value
are refused with the fix; TensorFlow's partition-aware ``create_variable``."""

import keras
import numpy as np
import pytest
from cluster_helpers import local_cluster, local_servers  # noqa: F401 - a fixture

import stratax as sx
from stratax._src.parameter_server.shard_init import build_rows, remote_recipe

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_threshold():
    sx.config.update("ps_build_on_servers_bytes", 4000)  # the table (1000 x 8 x 4 bytes) only
    yield
    sx.config.reset("ps_build_on_servers_bytes")


def _model(strategy):
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(1000, 8, embeddings_initializer=keras.initializers.RandomNormal(
                stddev=0.05, seed=11)),
            keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def test_a_large_keras_table_is_built_by_its_servers(local_cluster, small_threshold,  # noqa: F811
                                                    tmp_path):
    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
    model = _model(strategy)
    table = model.layers[0].embeddings
    recipe = remote_recipe(table)
    assert recipe is not None and recipe.kind == "normal" and recipe.seed == 11
    assert remote_recipe(model.layers[2].kernel) is None        # small: Keras builds it here
    placed = strategy.place_variables(table)
    # The servers' shards are the recipe's rows: no value came from the chief.
    expected = build_rows(recipe, 0, 1000, (1000, 8), np.dtype("float32"))
    np.testing.assert_array_equal(placed.numpy(), expected)
    assert [v.shape[0] for v in placed.variables] == [500, 500]

    x = np.random.default_rng(0).integers(0, 1000, (64, 3)).astype("int32")
    y = np.ones((64, 1), "float32")
    whole_pulls = [s["whole_pulls"] for s in strategy.shard_stats(table)]   # the check above
    history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert history.history["loss"][1] < history.history["loss"][0]
    assert strategy.optimizer_iterations(placed) == [8, 8]
    assert np.isfinite(model.evaluate(x, y, batch_size=16, verbose=0))
    assert model.predict(x, batch_size=16, verbose=0).shape == (64, 1)
    # fit, evaluate and predict read rows only: nobody pulled the table whole.
    assert [s["whole_pulls"] for s in strategy.shard_stats(table)] == whole_pulls
    assert not np.array_equal(placed.numpy(), expected)          # trained on the servers
    # Adam's slots of the table are built on the servers too (never zeros on the chief).
    slots = [v for v in model.optimizer.variables if tuple(v.shape) == (1000, 8)]
    assert len(slots) == 2 and all(remote_recipe(v) is not None for v in slots)
    # Eager reads name the variable, its size and the way out.
    for read in (model.get_weights, table.numpy, lambda: np.asarray(table),
                 lambda: table.assign(np.zeros((1000, 8))),
                 lambda: model.save_weights(str(tmp_path / "w.weights.h5")),
                 lambda: model.save(str(tmp_path / "m.keras"))):
        with pytest.raises(ValueError, match=r"'sequential(_\d+)?/embedding/embeddings' of shape "
                                             r"\(1000, 8\).*strategy.save_checkpoint"):
            read()


def test_below_the_threshold_keras_builds_every_variable(local_cluster):  # noqa: F811
    strategy = local_cluster()
    model = _model(strategy)
    assert all(remote_recipe(v) is None for v in model.variables)
    before = model.layers[0].embeddings.numpy()
    np.testing.assert_array_equal(strategy.place_variables(model.layers[0].embeddings).numpy(),
                                  before)                        # Keras' own bits, exact


def test_create_variable_with_tensorflows_partition_arguments(local_cluster):  # noqa: F811
    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(3))
    calls = []

    def init(partition_shape, partition_offset):
        calls.append((partition_shape, partition_offset))
        return np.full(partition_shape, partition_offset[0], np.float32)

    table = strategy.create_variable(init, shape=(8, 2), name="t")
    assert calls == [((3, 2), (0, 0)), ((3, 2), (3, 0)), ((2, 2), (6, 0))]
    assert table.numpy()[:, 0].tolist() == [0, 0, 0, 3, 3, 3, 6, 6]


def test_hybrid_mode_flushes_the_dense_part_only(small_threshold):
    """Hybrid mode: the server-built table stays on the servers, row-sparse; the dense layers
    are replicated on the workers and only they come back at the end of fit."""
    with local_servers(ps=2, workers=2) as make:
        strategy = make(mode="sync", dense_variables="workers",
                        variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
        model = _model(strategy)
        table = strategy.place_variables(model.layers[0].embeddings)
        x = np.random.default_rng(0).integers(0, 1000, (64, 3)).astype("int32")
        history = model.fit(x, np.ones((64, 1), "float32"), batch_size=16, epochs=2, verbose=0)
        assert history.history["loss"][1] < history.history["loss"][0]
        assert strategy.optimizer_iterations(table) == [8, 8]
        assert [s["whole_pulls"] for s in strategy.shard_stats(table)] == [0, 0]
        kernel = model.layers[2].kernel                              # came back from a worker
        np.testing.assert_array_equal(kernel.numpy(),
                                      strategy.place_variables(kernel).numpy())
        assert int(model.optimizer.iterations.numpy()) == 8
