"""Keras fit/evaluate/predict under TPUStrategy on 8 emulated cores, through TPURunner.

Equal to one device (2e-5) with the last batch padded, one compiled program for the whole fit,
``steps_per_execution`` groups as one call each, model parallelism with a LayoutMap (also under
MirroredStrategy), mixed_bfloat16, and the TensorFlow guide program.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import jax
import keras
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from tpu_hook import tpu_runner_hook

import stratax as sx
from stratax._src.keras.runners.tpu_padding import pad_batch
from stratax._src.keras.runners.tpu_runner import _check_hosts_in_order
from stratax._src.runtime import tpu_system

TOLERANCE = 2e-5
ROWS, BATCH = 100, 16     # 7 steps per epoch, the last one 4 real rows padded to 16


@pytest.fixture(autouse=True)
def _fresh_tpu_system():
    yield
    tpu_system.system.resolver = tpu_system.system.topology = None


def _data(rows=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 12)).astype(np.float32)
    return x, rng.integers(0, 4, rows), rng.uniform(0.5, 2.0, rows).astype(np.float32)


def _build(strategy, steps_per_execution=1):
    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(4)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"],   # unweighted: must not count padding rows
                      weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="w_acc"),
                                        keras.metrics.SparseCategoricalCrossentropy(
                                            from_logits=True, name="w_xent")],
                      steps_per_execution=steps_per_execution)
    return model


def _tpu_strategy(cores_per_replica=1, layout_map=None):
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=8)
    topology = sx.tpu.experimental.initialize_tpu_system(resolver)
    # The emulated mesh is [4, 1, 1, 2]: 4 cores per replica take 2 along its first dimension.
    computation_shape = [1, 1, 1, cores_per_replica] if cores_per_replica <= 2 else [
        cores_per_replica // 2, 1, 1, 2]
    assignment = sx.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=computation_shape, num_replicas=8 // cores_per_replica)
    return sx.TPUStrategy(resolver, experimental_device_assignment=assignment,
                          layout_map=layout_map)


def _kernels_split_map():
    layout_map = keras.distribution.LayoutMap(None)
    layout_map[".*dense.*kernel"] = (None, "core")
    return layout_map


def _run_all(model, x, y, w):
    history = model.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=3, shuffle=False,
                        verbose=0)
    scores = model.evaluate(x, y, sample_weight=w, batch_size=BATCH, verbose=0, return_dict=True)
    predictions = model.predict(x, batch_size=BATCH, verbose=0)
    return history.history, scores, predictions, model.get_weights()


def _assert_same(reference, candidate):
    (h1, s1, p1, w1), (h2, s2, p2, w2) = reference, candidate
    assert h1.keys() == h2.keys() and s1.keys() == s2.keys()
    for key in h1:
        np.testing.assert_allclose(h2[key], h1[key], atol=TOLERANCE, err_msg=key)
    for key in s1:
        np.testing.assert_allclose(s2[key], s1[key], atol=TOLERANCE, err_msg=key)
    assert p2.shape == p1.shape
    np.testing.assert_allclose(p2, p1, atol=TOLERANCE)
    for a, b in zip(w1, w2, strict=True):
        np.testing.assert_allclose(b, a, atol=TOLERANCE)


@pytest.fixture(scope="module")
def reference():
    """One device, Keras' own loop (its steps_per_execution runs the same steps one by one)."""
    x, y, w = _data()
    return _run_all(_build(sx.OneDeviceStrategy("cpu:0")), x, y, w)


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_eight_replicas_equal_one_device_with_a_padded_last_batch(reference, steps_per_execution):
    x, y, w = _data()
    model = _build(_tpu_strategy(), steps_per_execution)
    with tpu_runner_hook() as counters:
        result = _run_all(model, x, y, w)
    _assert_same(reference, result)
    assert counters["make_step"] == 3     # train, test, predict
    groups = -(-7 // steps_per_execution)  # 7 steps per epoch
    assert counters["calls"] == 3 * groups + groups + groups


def test_four_replicas_by_two_cores_with_split_kernels_equal_the_unsplit_model(reference):
    x, y, w = _data()
    strategy = _tpu_strategy(cores_per_replica=2, layout_map=_kernels_split_map())
    model = _build(strategy)
    assert [v.value.sharding.spec for v in model.trainable_variables] == [
        P(None, "core"), P(None), P(None, "core"), P(None)]
    with tpu_runner_hook():
        result = _run_all(model, x, y, w)
    assert model.trainable_variables[0].value.sharding.spec == P(None, "core")
    _assert_same(reference, result)


def test_the_same_layout_map_under_mirrored_strategy():
    # Every batch full: the bridge's fit (not yet a runner) splits batches over all 8 devices.
    x, y, w = _data(rows=96)
    expected = _run_all(_build(sx.OneDeviceStrategy("cpu:0")), x, y, w)
    strategy = sx.MirroredStrategy(cores_per_replica=2, layout_map=_kernels_split_map())
    assert dict(strategy.mesh.shape) == {"replica": 4, "core": 2}
    model = _build(strategy)
    assert model.trainable_variables[0].value.sharding.spec == P(None, "core")
    _assert_same(expected, _run_all(model, x, y, w))


def test_a_layout_that_does_not_divide_names_the_rule_and_the_variable():
    """The docs' rule on a 2x4 split also matches the Dense(10) head: 10 does not split in 4."""

    def build(hidden_name):
        return keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, name=hidden_name),
                                 keras.layers.Dense(10, name="dense_head")], name="net")

    strategy = _tpu_strategy(cores_per_replica=4, layout_map=_kernels_split_map())
    with strategy.scope(), pytest.raises(
            ValueError, match=r"layout_map\['\.\*dense\.\*kernel'\] = \(None, 'core'\) splits "
                              r"dimension 1 of variable 'net/dense_head/kernel' \(shape "
                              r"\(64, 10\)\) into 4 parts .* 10 is not divisible by 4\. Narrow "
                              r"the rule"):
        build("dense_hidden")
    layout_map = keras.distribution.LayoutMap(None)
    layout_map[".*hidden.*kernel"] = (None, "core")  # the fix: name the layers to split
    with _tpu_strategy(cores_per_replica=4, layout_map=layout_map).scope():
        model = build("hidden")
    assert [v.value.sharding.spec for v in model.trainable_variables][::2] == [
        P(None, "core"), P(None, None)]


def test_whole_fit_compiles_one_program(caplog):
    x, y, w = _data()
    model = _build(_tpu_strategy(), steps_per_execution=4)
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING), tpu_runner_hook():
            model.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
    finally:
        jax.config.update("jax_log_compiles", False)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "Compiling jit(tpu_steps)" in m]) == 1, messages
    assert not [m for m in messages if "Compiling jit(train_step)" in m]


def test_pad_batch_weights():
    x, y, w = _data(rows=4)
    px, py, pw = pad_batch((x, y, w), 16)
    assert px.shape == (16, 12) and py.shape == (16,) and pw.real_rows == 4
    np.testing.assert_allclose(pw[:4], w)   # the step scales them by 16 / 4
    assert not pw[4:].any() and not px[4:].any()
    _, _, full = pad_batch((x, y), 4)
    assert full.real_rows == 4 and (np.asarray(full) == 1).all()
    with pytest.raises(ValueError, match="batch of 4 rows is larger than the static batch size 2"):
        pad_batch((x, y), 2)


def test_a_pod_assignment_that_interleaves_the_hosts_is_refused():
    """On several hosts each host's share of a batch is a block of replicas, host by host."""
    def strategy(owners):
        devices = np.empty((len(owners), 2), dtype=object)
        for replica, cores in enumerate(owners):
            devices[replica] = [SimpleNamespace(process_index=p) for p in cores]
        return SimpleNamespace(mesh=SimpleNamespace(devices=devices),
                               num_replicas_in_sync=len(owners))

    _check_hosts_in_order(strategy([(0, 0), (0, 0), (1, 1), (1, 1)]), "fit")
    with pytest.raises(ValueError, match=r"replica 2 is on host\(s\) \[0\], after a replica "
                                         r"on host 1. Use the default device assignment"):
        _check_hosts_in_order(strategy([(0, 0), (1, 1), (0, 0), (1, 1)]), "fit")
    with pytest.raises(ValueError, match=r"model.predict .* replica 1 is on host\(s\) \[0, 1\]"):
        _check_hosts_in_order(strategy([(0, 0), (0, 1), (1, 1)]), "predict")


def test_batch_size_must_split_over_the_replicas():
    x, y, _ = _data()
    model = _build(_tpu_strategy())
    with tpu_runner_hook(), pytest.raises(ValueError, match="Global batch size 12 does not split"):
        model.fit(x, y, batch_size=12, verbose=0)


def test_mixed_bfloat16_trains():
    x, y, _ = _data(rows=256)
    y = (x[:, 0] > 0).astype(np.int32)      # a learnable target
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = _build(_tpu_strategy(), steps_per_execution=4)
        with tpu_runner_hook():
            history = model.fit(x, y, batch_size=32, epochs=8, shuffle=False, verbose=0)
        assert model.layers[0].compute_dtype == "bfloat16"
        assert model.layers[0].kernel.dtype == "float32"
    finally:
        keras.mixed_precision.set_global_policy("float32")
    losses = history.history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < 0.7 * losses[0], losses
    assert history.history["accuracy"][-1] > 0.85


@pytest.mark.parametrize("kind", ["tf_data", "grain"])
def test_user_pipelines_equal_one_device(reference, kind):
    """tf.data and grain batches, padded to the static batch like arrays: every epoch read."""
    x, y, w = _data()
    # The test extra installs both; .ci/other_end_of_range.sh (Keras 3.10) has grain only.
    if kind == "tf_data":
        tf = pytest.importorskip("tensorflow")
        data = tf.data.Dataset.from_tensor_slices((x, y, w)).batch(BATCH)
    else:
        grain = pytest.importorskip("grain")
        data = grain.MapDataset.source(list(zip(x, y, w, strict=True))).batch(BATCH)
    model = _build(_tpu_strategy())
    history = model.fit(data, epochs=3, verbose=0)
    scores = model.evaluate(data, verbose=0, return_dict=True)
    predictions = model.predict(data, verbose=0)
    _assert_same(reference, (history.history, scores, predictions, model.get_weights()))


def test_tensorflow_guide_program(caplog):
    """The TPU guide's program with two import lines changed, emulated on 8 cores."""
    (x_train, y_train), (x_test, y_test) = sx.datasets.load_digits()
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=8)
    sx.config.experimental_connect_to_cluster(resolver)
    with caplog.at_level(logging.INFO):
        sx.tpu.experimental.initialize_tpu_system(resolver)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("stratax")]
    assert "emulated" in ours[0]
    strategy = sx.TPUStrategy(resolver)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    with tpu_runner_hook():
        history = model.fit(x_train, y_train, epochs=5, verbose=0)
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)   # 360 rows: last batch padded
        logits = model.predict(x_test, verbose=0)
    assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
    assert logits.shape == (len(x_test), 10)
    assert accuracy == pytest.approx((logits.argmax(axis=1) == y_test).mean(), abs=1e-6)
    assert accuracy > 0.9
