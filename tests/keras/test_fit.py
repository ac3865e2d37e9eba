"""Keras ``fit``/``evaluate``/``predict`` under a strategy: inputs, partial batches, callbacks,
errors."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import stratax as sx

REPLICAS = ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


def _data(n=100, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, n)


def _compiled(strategy, **compile_kwargs):
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], **compile_kwargs)
    return model


def _assert_same_weights(a, b, tol=2e-5):
    for got, want in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, atol=tol, rtol=tol)


def test_variables_are_mirrored_on_every_replica():
    strategy = sx.MirroredStrategy(REPLICAS)
    model = _compiled(strategy)
    kernel = model.layers[0].kernel.value
    assert kernel.sharding.is_fully_replicated
    assert {d.id for d in kernel.sharding.device_set} == {0, 1, 2, 3}


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_partial_last_batch_is_trained_not_dropped(steps_per_execution):
    """100 examples at global batch 24: the last batch of 4 examples runs on every replica."""
    x, y = _data(100)
    one = _compiled(sx.OneDeviceStrategy("cpu:0"), steps_per_execution=steps_per_execution)
    many = _compiled(sx.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]),
                     steps_per_execution=steps_per_execution)
    h1 = one.fit(x, y, batch_size=24, epochs=2, shuffle=False, verbose=0)
    h2 = many.fit(x[:, :], y, batch_size=24, epochs=2, shuffle=False, verbose=0)
    _assert_same_weights(one, many)
    np.testing.assert_allclose(h1.history["loss"], h2.history["loss"], rtol=1e-5)
    # A different number of examples changes the result: the partial batch mattered.
    dropped = _compiled(sx.OneDeviceStrategy("cpu:0"))
    dropped.fit(x[:96], y[:96], batch_size=24, epochs=2, shuffle=False, verbose=0)
    assert not np.allclose(dropped.get_weights()[0], many.get_weights()[0], atol=1e-6)


def test_evaluate_and_predict_match_one_device():
    x, y = _data(90)
    one = _compiled(sx.OneDeviceStrategy("cpu:0"))
    many = _compiled(sx.MirroredStrategy(REPLICAS))
    np.testing.assert_allclose(many.evaluate(x, y, batch_size=20, verbose=0),
                               one.evaluate(x, y, batch_size=20, verbose=0), rtol=1e-5)
    predictions = many.predict(x, batch_size=20, verbose=0)
    assert predictions.shape == (90, 3)
    np.testing.assert_allclose(predictions, one.predict(x, batch_size=20, verbose=0), atol=1e-6)


def _batch_list(x, y, batch):
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, len(x), batch)]


def test_fit_accepts_iterables_pydatasets_and_distributed_datasets():
    x, y = _data(96)
    strategy = sx.MirroredStrategy(REPLICAS)
    reference = _compiled(sx.OneDeviceStrategy("cpu:0"))
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return x[16 * i:16 * (i + 1)], y[16 * i:16 * (i + 1)]

    inputs = {
        "list of batches": _batch_list(x, y, 16),
        "PyDataset": Batches(),
        "distributed dataset": strategy.experimental_distribute_dataset(_batch_list(x, y, 16)),
    }
    for name, data in inputs.items():
        model = _compiled(strategy)
        history = model.fit(data, epochs=2, shuffle=False, verbose=0)
        assert len(history.history["loss"]) == 2, name
        _assert_same_weights(reference, model)

    def generator():
        for _ in range(2):
            yield from _batch_list(x, y, 16)

    model = _compiled(strategy)
    model.fit(generator(), epochs=2, steps_per_epoch=6, verbose=0)
    _assert_same_weights(reference, model)


def test_fit_accepts_datasets_from_function():
    x, y = _data(96)
    strategy = sx.MirroredStrategy(REPLICAS)

    def dataset_fn(ctx):
        per_replica = ctx.get_per_replica_batch_size(16)
        return [(x[i:i + per_replica], y[i:i + per_replica]) for i in range(0, 96, per_replica)]

    model = _compiled(strategy)
    model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=1, steps_per_epoch=6,
              verbose=0)
    reference = _compiled(sx.OneDeviceStrategy("cpu:0"))
    reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    _assert_same_weights(reference, model)


def test_callbacks_checkpoint_early_stopping_backup(tmp_path):
    x, y = _data(64)
    strategy = sx.MirroredStrategy(REPLICAS)
    model = _compiled(strategy)
    callbacks = [
        keras.callbacks.ModelCheckpoint(str(tmp_path / "best.weights.h5"), save_weights_only=True),
        keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0),
        keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),
    ]
    history = model.fit(x, y, batch_size=16, epochs=5, callbacks=callbacks, verbose=0)
    assert len(history.history["loss"]) == 2  # stopped early: the loss never improves by 10
    restored = _compiled(sx.OneDeviceStrategy("cpu:0"))
    restored.load_weights(str(tmp_path / "best.weights.h5"))
    _assert_same_weights(model, restored, tol=0)


def test_load_weights_then_fit_resumes_the_optimizer_state(tmp_path):
    """TensorFlow restores an optimizer's slots from a checkpoint; Keras alone skips them when
    load_weights comes before the first fit (a warning, then Adam restarts). Under a strategy
    the optimizer state in the file is loaded, and training goes on as if never stopped."""
    import warnings

    x, y = _data(64)
    strategy = sx.MirroredStrategy(REPLICAS)
    model = _compiled(strategy)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    model.save_weights(str(tmp_path / "w.weights.h5"))
    loaded = _compiled(strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Skipping variable loading for optimizer ..."
        loaded.load_weights(str(tmp_path / "w.weights.h5"))
    assert int(loaded.optimizer.iterations.numpy()) == int(model.optimizer.iterations.numpy()) == 4
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    _assert_same_weights(model, loaded, tol=1e-6)


def test_backup_and_restore_resumes_an_interrupted_fit(tmp_path):
    x, y = _data(64)
    strategy = sx.MirroredStrategy(REPLICAS)

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                raise RuntimeError("preempted")

    backup = str(tmp_path / "backup")
    model = _compiled(strategy)
    with pytest.raises(RuntimeError, match="preempted"):
        model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                  callbacks=[keras.callbacks.BackupAndRestore(backup), Interrupt()])
    resumed = _compiled(strategy)
    history = resumed.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                          callbacks=[keras.callbacks.BackupAndRestore(backup)])
    assert len(history.history["loss"]) == 2  # epochs 2 and 3 only
    uninterrupted = _compiled(strategy)
    uninterrupted.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
    _assert_same_weights(uninterrupted, resumed)


def test_tensorboard_callback_if_installed(tmp_path):
    # Keras' own callback writes through tf.summary (stratax's, without TensorFlow, is
    # sx.callbacks.TensorBoard: tests/observe/test_tensorboard.py).
    pytest.importorskip("tensorflow", reason="keras.callbacks.TensorBoard needs TensorFlow")
    x, y = _data(32)
    model = _compiled(sx.MirroredStrategy(REPLICAS))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(str(tmp_path / "logs"))])
    assert any((tmp_path / "logs").rglob("events.out.tfevents.*"))


def test_batch_that_does_not_split_over_replicas_is_an_error():
    x, y = _data(30)
    model = _compiled(sx.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]))
    with pytest.raises(ValueError, match="Global batch size 16 does not split over 3 replicas"):
        model.fit(x, y, batch_size=16, verbose=0)
    with pytest.raises(ValueError, match="Global batch size 32 does not split over 3 replicas"):
        model.evaluate(x, y, verbose=0)  # Keras' default batch of 32


def test_model_of_one_strategy_in_another_scope_is_an_error():
    x, y = _data(16)
    model = _compiled(sx.MirroredStrategy(REPLICAS))
    other = sx.MirroredStrategy(["cpu:4", "cpu:5"])
    with other.scope(), pytest.raises(sx.MixedStrategyError, match="created under"):
        model.fit(x, y, batch_size=8, verbose=0)


def test_model_created_in_scope_trains_distributed_outside_it():
    strategy = sx.MirroredStrategy(REPLICAS)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")  # compiled outside the scope, as TF allows
    x, _y = _data(16)
    model.fit(x, np.ones((16, 3), np.float32), batch_size=8, verbose=0)
    assert model.layers[0].kernel.value.sharding.is_fully_replicated
    assert len(model.optimizer.variables[0].value.sharding.device_set) == 4


def test_plain_keras_without_strategy_is_untouched():
    x, _y = _data(16)
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, np.ones((16, 3), np.float32), batch_size=5, verbose=0)  # any batch size
    assert len(model.layers[0].kernel.value.sharding.device_set) == 1


@pytest.mark.timeout(120)
def test_keras_with_another_backend_is_a_clear_error():
    env = dict(os.environ, KERAS_BACKEND="numpy")
    done = subprocess.run(
        [sys.executable, "-c", "import keras; import stratax"],
        capture_output=True, text=True, timeout=100, env=env,
    )
    assert done.returncode != 0
    assert "imported with the 'numpy' backend before stratax" in done.stderr


@pytest.mark.parametrize(("devices", "group", "program"), [
    (["cpu:0"], 1, "train_step"), (["cpu:0", "cpu:1"], 1, "train_step"),
    (["cpu:0"], 2, "row_steps"), (["cpu:0", "cpu:1"], 2, "row_steps"),
], ids=["1rep", "2rep", "1rep-spe2", "2rep-spe2"])
def test_fit_compiles_the_train_step_once(devices, group, program, caplog):
    """Shardings must stay stable between steps and epochs, or XLA recompiles every epoch
    (one program per group of ``steps_per_execution`` steps when the group runs as one)."""
    import jax

    x, y = _data(64)
    model = _compiled(sx.MirroredStrategy(devices), steps_per_execution=group)
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level("WARNING"):
            model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    finally:
        jax.config.update("jax_log_compiles", False)
    compiles = [r for r in caplog.records if f"Compiling jit({program})" in r.getMessage()]
    assert len(compiles) == 1, [r.getMessage()[:120] for r in caplog.records
                                if "Compiling" in r.getMessage()]


def test_steps_without_batch_size_cut_the_data_as_keras_does():
    """Keras' rule: `steps` batches cover the arrays when no batch size is given."""
    x, y = _data(90)
    plain = _compiled(sx.OneDeviceStrategy("cpu:0"))
    weights = plain.get_weights()
    keras.utils.set_random_seed(3)
    reference = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")])
    reference.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                      loss="sparse_categorical_crossentropy")
    reference.set_weights(weights)
    # 3 steps of 30 rows (not 32, 32 and a partial 26): the updates differ otherwise.
    plain.fit(x, y, steps_per_epoch=3, epochs=1, shuffle=False, verbose=0)
    reference.fit(x, y, steps_per_epoch=3, epochs=1, shuffle=False, verbose=0)
    _assert_same_weights(plain, reference, tol=1e-6)


def test_validation_data_with_dict_inputs_is_one_set_of_arrays():
    """``validation_data=(x_dict, y)`` is x and y, not a list of two batches (it was taken for
    one, and the validation step got no labels)."""
    rng = np.random.default_rng(0)
    x = {"a": rng.normal(size=(64, 3)).astype(np.float32),
         "b": rng.normal(size=(64, 2)).astype(np.float32)}
    y = rng.integers(0, 3, 64)
    with sx.MirroredStrategy(["cpu:0", "cpu:1"]).scope():
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        model = keras.Model({"a": a, "b": b},
                            keras.layers.Dense(3)(keras.layers.Concatenate()([a, b])))
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0, validation_data=(x, y))
    np.testing.assert_allclose(history.history["val_loss"][0],
                               model.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-6)


@pytest.mark.parametrize("devices", [["cpu:0"], ["cpu:0", "cpu:1"]])
def test_an_input_fit_cannot_read_is_refused_naming_it(devices):
    with sx.MirroredStrategy(devices).scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError, match=r"x of type int\. .*tf\.data\.Dataset, a grain dataset"):
        model.fit(42, epochs=1, verbose=0)


class _StepsPerEpoch(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.counts = []

    def on_epoch_begin(self, epoch, logs=None):
        self.counts.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.counts[-1] += 1


def _small_model(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    return model


def test_a_generator_used_up_by_an_earlier_epoch_says_so():
    """An iterator is read once, as Keras reads it; the epochs after it are not silent."""
    x = np.ones((32, 3), np.float32)
    batches = ((x[i:i + 8], x[i:i + 8, :1]) for i in range(0, 32, 8))
    model = _small_model(sx.MirroredStrategy(["cpu:0", "cpu:1"]))
    counter = _StepsPerEpoch()
    with pytest.warns(UserWarning, match="Epoch 1 reads no batch: the generator"):
        model.fit(batches, epochs=2, verbose=0, callbacks=[counter])
    assert counter.counts == [4, 0]


def test_datasets_from_function_are_read_anew_every_epoch():
    """TensorFlow re-iterates each worker's dataset per epoch; so does fit here."""
    x = np.ones((32, 3), np.float32)
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    per_replica = strategy.distribute_datasets_from_function(
        lambda context: [(x[i:i + 8], x[i:i + 8, :1]) for i in range(0, 32, 8)])
    counter = _StepsPerEpoch()
    _small_model(strategy).fit(per_replica, epochs=3, verbose=0, callbacks=[counter])
    assert counter.counts == [2, 2, 2]  # 4 per-replica batches, 2 replicas: 2 steps an epoch
