"""Sharded checkpoints (``strategy.save_checkpoint(directory)``): each ps writes and reads its
own shards; the chief commits a manifest; a failed save leaves the previous version; restore
into another number of ps and another partitioner; Keras reads the directory; ``latest`` is
resolved only inside its directory."""

import json

import keras
import numpy as np
import pytest
from cluster_helpers import local_cluster, local_servers  # noqa: F401 - a fixture

import stratax as sx
from stratax._src.checkpoint import sharded_variables

pytestmark = pytest.mark.timeout(120)


def _trained(strategy):
    """A table and a bias (2 shards each), each given 3 Adam updates from the chief's
    custom loop (so they have slots and counts)."""
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    table = strategy.create_variable(np.arange(40, dtype=np.float32).reshape(10, 4), name="t")
    bias = strategy.create_variable(np.zeros(4, np.float32), name="b")
    optimizer = keras.optimizers.Adam(0.1)

    def replica_fn(x):
        grads = [np.float32(1.0) * (x + np.arange(10, dtype=np.float32)[:, None]),
                 np.ones(4, np.float32) * x[0, 0]]
        strategy.apply_gradients(list(zip(grads, [table, bias], strict=True)), optimizer)
        return x[0, 0]

    dataset = coordinator.create_per_worker_dataset(_ones)
    iterator = iter(dataset)
    for _ in range(3):
        coordinator.schedule(lambda it: strategy.run(replica_fn, args=(next(it),)),
                             args=(iterator,))
    coordinator.join()
    return table, bias


def _ones(input_context):
    while True:
        yield np.ones((10, 4), np.float32)


def test_each_ps_writes_its_shards_and_a_restore_reshards(local_cluster, tmp_path):  # noqa: F811
    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
    table, bias = _trained(strategy)
    saved = {"t": table.numpy(), "b": bias.numpy()}
    stats = [strategy.shard_stats(table), strategy.shard_stats(bias)]
    assert [s["iterations"] for s in stats[0]] == [3, 3]
    path = tmp_path / "ckpt"
    strategy.save_checkpoint(str(path))

    assert (path / "latest").read_text() == "v1"
    manifest = json.loads((path / "v1" / "manifest.json").read_text())
    entries = {e["name"]: e for e in manifest["variables"]}
    assert [(p["start"], p["rows"], p["iterations"]) for p in entries["t"]["parts"]] == [
        (0, 5, 3), (5, 5, 3)]
    assert entries["t"]["slots"] == ["m", "v"]
    written = sorted(str(f.relative_to(path / "v1")) for f in (path / "v1").rglob("*.npy"))
    assert len(written) == 12 and {w.split("/")[0] for w in written} == {"ps0", "ps1"}
    np.testing.assert_array_equal(np.load(path / "v1" / entries["t"]["parts"][1]["file"]
                                          .__add__(".npy")), saved["t"][5:])

    # Training on changes the values; the restore brings back values, slots and counts.
    _trained_more = table.assign(np.zeros((10, 4), np.float32))
    del _trained_more
    assert strategy.restore_checkpoint(str(path)) == ["t", "b"]
    np.testing.assert_array_equal(table.numpy(), saved["t"])
    assert [s["iterations"] for s in strategy.shard_stats(table)] == [3, 3]

    # Into 3 ps and 3 shards (another partitioning), and into plain Keras variables.
    with local_servers(ps=3) as make:
        other = make(variable_partitioner=sx.partitioners.FixedShardsPartitioner(3))
        table3 = other.create_variable(np.zeros((10, 4), np.float32), name="t")
        bias3 = other.create_variable(np.ones(4, np.float32), name="b")
        other.restore_checkpoint(str(path))
        np.testing.assert_array_equal(table3.numpy(), saved["t"])
        np.testing.assert_array_equal(bias3.numpy(), saved["b"])
        assert [len(table3.variables), *other.optimizer_iterations(table3)] == [3, 3, 3, 3]
    kernel = keras.Variable(np.zeros((10, 4), np.float32), name="t")
    assert sx.checkpoint.load_variables(str(path), [kernel]) == ["t"]
    np.testing.assert_array_equal(kernel.numpy(), saved["t"])


def test_versions_commit_atomically_and_latest_stays_inside(local_cluster, tmp_path):  # noqa: F811
    strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
    table = strategy.create_variable(np.ones((6, 2), np.float32), name="t")
    path = tmp_path / "ckpt"
    strategy.save_checkpoint(str(path))
    table.assign(np.full((6, 2), 2.0, np.float32))
    strategy.save_checkpoint(str(path))
    assert (path / "latest").read_text() == "v2" and (path / "v1").is_dir()

    # A save that fails on a ps (a shard it does not have) commits nothing: latest stays v2.
    ghost = strategy.create_variable(np.ones((4, 2), np.float32), name="ghost")
    strategy._ps.clients[ghost.placements[0].ps].call("import", {"names": [], "shards": []})
    bad = type(ghost)(ghost.name, ghost.shape, ghost.dtype, True,
                      [type(ghost.placements[0])(ghost.placements[0].ps, "missing", 0, 4)],
                      strategy._store.pull, strategy._store.assign)
    table.assign(np.full((6, 2), 3.0, np.float32))
    with pytest.raises(Exception, match="missing"):
        strategy.save_checkpoint(str(path), [table, bad])
    assert (path / "latest").read_text() == "v2"
    strategy.restore_checkpoint(str(path), [table])
    assert table.numpy().tolist() == [[2.0, 2.0]] * 6

    strategy.save_checkpoint(str(path), [table])  # v4; v3 (failed) and v1 removed, v2 kept
    assert sorted(p.name for p in path.iterdir()) == ["latest", "v2", "v4"]

    for text, problem in [("../elsewhere", "not the name of a checkpoint version"),
                          ("ckpt-x", "not the name of a checkpoint version"),
                          ("v9", "not the name of a checkpoint version")]:
        (path / "latest").write_text(text)
        with pytest.raises(ValueError, match=problem) as err:
            strategy.restore_checkpoint(str(path), [table])
        assert str(path / "latest") in str(err.value) and "v4" in str(err.value)
        with pytest.raises(ValueError, match=problem):
            strategy.save_checkpoint(str(path), [table])
    with pytest.raises(ValueError, match="holds no committed sharded checkpoint"):
        sharded_variables.read_manifest(tmp_path / "nothing")


def test_a_table_built_on_its_servers_saves_sharded_only(local_cluster, tmp_path):  # noqa: F811
    sx.config.update("ps_build_on_servers_bytes", 4000)
    try:
        strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,), dtype="int32"),
                                      keras.layers.Embedding(1000, 8), keras.layers.Flatten(),
                                      keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        x = np.arange(48, dtype="int32").reshape(16, 3)
        model.fit(x, np.ones((16, 1), "float32"), batch_size=8, verbose=0)
        table = strategy.place_variables(model.layers[0].embeddings)
        with pytest.raises(ValueError, match="save to a directory instead"):
            strategy.save_checkpoint(str(tmp_path / "model.npz"))
        strategy.save_checkpoint(str(tmp_path / "ckpt"))
        trained = table.sparse_read([0, 47, 999])
        table.scatter_update(type("Slices", (), {"indices": np.array([0, 47]),
                                                 "values": np.zeros((2, 8), np.float32)})())
        strategy.restore_checkpoint(str(tmp_path / "ckpt"))
        np.testing.assert_array_equal(table.sparse_read([0, 47, 999]), trained)
    finally:
        sx.config.reset("ps_build_on_servers_bytes")


def test_a_model_with_a_server_built_table_serves_from_its_checkpoint(local_cluster,  # noqa: F811
                                                                       tmp_path):
    """for_serving: the Embedding becomes a RowLookup over the sharded checkpoint, the rest is
    loaded from it; predictions equal the strategy's, also after a .keras round trip."""
    sx.config.update("ps_build_on_servers_bytes", 4000)
    try:
        strategy = local_cluster(variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
        with strategy.scope():
            ids = keras.Input((3,), dtype="int32")
            rows = keras.layers.Embedding(1000, 8)(ids)
            out = keras.layers.Dense(1)(keras.layers.Flatten()(rows))
            model = keras.Model(ids, out)
            model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        x = np.random.default_rng(1).integers(0, 1000, (32, 3)).astype("int32")
        model.fit(x, np.ones((32, 1), "float32"), batch_size=8, epochs=2, verbose=0)
        expected = model.predict(x, batch_size=8, verbose=0)
        strategy.save_checkpoint(str(tmp_path / "ckpt"))
    finally:
        sx.config.reset("ps_build_on_servers_bytes")
    served = sx.serving.for_serving(model, str(tmp_path / "ckpt"))
    assert isinstance(served.layers[1], sx.serving.RowLookup)
    np.testing.assert_allclose(served.predict(x, verbose=0), expected, atol=1e-6)
    served.save(tmp_path / "served.keras")
    assert (tmp_path / "served.keras").stat().st_size < 1000 * 8 * 4     # no table inside
    loaded = keras.models.load_model(tmp_path / "served.keras")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, atol=1e-6)
    with pytest.raises(Exception, match=r"ids must be in \[0, 1000\)"):  # JAX wraps it
        loaded.predict(np.array([[0, 1, 1000]], "int32"), verbose=0)


def test_a_restore_names_the_saved_variables_it_left(local_cluster, tmp_path, caplog):  # noqa: F811
    strategy = local_cluster()
    strategy.create_variable(np.ones(3, np.float32), name="a")
    strategy.create_variable(np.ones(3, np.float32), name="b")
    strategy.save_checkpoint(str(tmp_path / "ckpt"))
    with local_servers() as make:
        other = make()
        a = other.create_variable(np.zeros(3, np.float32), name="a")
        other.restore_checkpoint(str(tmp_path / "ckpt"))
        assert a.numpy().tolist() == [1.0, 1.0, 1.0]
    assert "left 1 saved variable(s) unrestored" in caplog.text and ": b." in caplog.text
