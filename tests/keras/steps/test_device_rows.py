"""``fit`` from arrays kept on the devices trains exactly what host-cut batches train.

With array input under the budget, every batch that splits over the replicas reaches the step as
a ``RowBatch`` and is gathered inside the compiled step (``keras.steps.device_rows``);
``STRATAX_RESIDENT_ARRAY_BYTES=0`` gives the host path of earlier releases, the reference here.
"""

import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.core import env
from stratax._src.keras.runners import mesh_runner
from stratax._src.keras.steps import device_rows

BATCH = 32


def _strategy(replicas):
    if replicas == 0:
        return sx.OneDeviceStrategy("cpu:0")
    return sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])


def _inputs(rows, dict_input):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 12)).astype(np.float32)
    y = rng.integers(0, 5, rows)
    if dict_input:
        return {"a": x[:, :7], "b": x[:, 7:]}, y
    return x, y


def _model(dict_input, dropout=False):
    if dict_input:
        a, b = keras.Input((7,), name="a"), keras.Input((5,), name="b")
        hidden = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()([a, b]))
        return keras.Model({"a": a, "b": b}, keras.layers.Dense(5)(hidden))
    middle = [keras.layers.Dropout(0.1)] if dropout else []
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                             *middle, keras.layers.Dense(5)])


def _fit(monkeypatch, budget, replicas, *, rows=200, shuffle=False, spe=1, dict_input=False,
         weights=None, dropout=False):
    monkeypatch.setenv(env.STRATAX_RESIDENT_ARRAY_BYTES, str(budget))
    x, y = _inputs(rows, dict_input)
    keras.utils.set_random_seed(7)
    with _strategy(replicas).scope():
        model = _model(dict_input, dropout)
        model.compile(optimizer=keras.optimizers.Adam(0.01), steps_per_execution=spe,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    extra = {}
    if weights == "sample":
        extra["sample_weight"] = np.linspace(0.5, 1.5, rows).astype(np.float32)
    elif weights == "class":
        extra["class_weight"] = {0: 2.0, 1: 0.5, 2: 1.0, 3: 1.0, 4: 3.0}
    history = model.fit(x, y, batch_size=BATCH, epochs=3, shuffle=shuffle, verbose=0,
                        validation_data=_inputs(64, dict_input), **extra)
    return model.get_weights(), history.history


def _host_placed_batches(monkeypatch):
    """Counts the batches the runner places from the host."""
    count = [0]
    original = mesh_runner.MeshRunner.batches

    def batches(self, local_batches):
        for batch in original(self, local_batches):
            count[0] += 1
            yield batch

    monkeypatch.setattr(mesh_runner.MeshRunner, "batches", batches)
    return count


@pytest.mark.parametrize("replicas,rows,shuffle,spe,dict_input,weights,host_cut", [
    # One device; every batch splits over 1 replica.
    (0, 203, True, 1, False, None, 0),
    # Grouped steps; the last batch (11 rows) does not split over 2 replicas: fed whole, from
    # the host.
    (2, 203, True, 3, False, "sample", 1),
    # Dict input, Keras' shuffle within batches; the last batch (8 rows) splits over 4.
    (4, 200, "batch", 1, True, "class", 0),
])
def test_kept_arrays_train_what_host_batches_train(monkeypatch, replicas, rows, shuffle, spe,
                                                   dict_input, weights, host_cut):
    placed = []
    original = device_rows.Resident.__init__

    def spy(self, *args, **kwargs):
        placed.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(device_rows.Resident, "__init__", spy)
    host_placed = _host_placed_batches(monkeypatch)
    options = dict(replicas=replicas, rows=rows, shuffle=shuffle, spe=spe,
                   dict_input=dict_input, weights=weights)
    host_weights, host_history = _fit(monkeypatch, 0, **options)
    assert placed == []
    # 3 epochs of 7 training batches and 2 validation batches (evaluate's, from the host).
    assert host_placed[0] == 3 * (7 + 2)
    host_placed[0] = 0
    kept_weights, kept_history = _fit(monkeypatch, 1 << 30, **options)
    assert len(placed) == 1  # once per fit, not per epoch
    assert host_placed[0] == 3 * (host_cut + 2)
    for kept, host in zip(kept_weights, host_weights, strict=True):
        np.testing.assert_allclose(kept, host, rtol=1e-6, atol=1e-7)
    assert kept_history.keys() == host_history.keys()
    for name, values in host_history.items():
        np.testing.assert_allclose(kept_history[name], values, rtol=1e-6, err_msg=name)


def test_arrays_over_the_budget_and_gspmd_steps_get_host_batches(monkeypatch):
    count = _host_placed_batches(monkeypatch)
    # 200 rows x 13 numbers x 4 bytes on each of 2 devices: over a budget of 20,000 bytes.
    _fit(monkeypatch, 20_000, 2)
    assert count[0] == 3 * (7 + 2)
    count[0] = 0
    # Dropout's random state keeps the model on GSPMD's step, which takes only placed batches.
    _fit(monkeypatch, 1 << 30, 2, dropout=True)
    assert count[0] == 3 * (7 + 2)


def test_a_malformed_budget_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(env.STRATAX_RESIDENT_ARRAY_BYTES, "1GB")
    with pytest.raises(ValueError, match="STRATAX_RESIDENT_ARRAY_BYTES='1GB' is not an integer"):
        _fit(monkeypatch, "1GB", 2)
