"""``fit``'s epoch logs come from the last train step's logs, and equal Keras' own.

Keras recomputes the epoch's metric results from the model's variables at every epoch end;
stratax answers from the last step's logs when they are those results (Keras' own train step,
metric variables untouched since). Both must give what Keras alone gives, also when a
callback changes the metrics after the last step.
"""

import contextlib

import keras
import numpy as np
import pytest
from keras.src.backend.common.stateless_scope import in_stateless_scope

import stratax as sx

STRATEGIES = {
    "one device": lambda: sx.OneDeviceStrategy("cpu:0"),
    "2 replicas": lambda: sx.MirroredStrategy(["cpu:0", "cpu:1"]),
}


def _fit(strategy, spe, callbacks=()):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(96, 12)).astype(np.float32)
    y = rng.integers(0, 5, 96)
    keras.utils.set_random_seed(7)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(5)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=spe)
    return model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
                     callbacks=list(callbacks)).history


@pytest.fixture
def eager_results(monkeypatch):
    """Counts ``get_metrics_result`` calls outside a traced step (Keras' epoch-end recompute)."""
    calls = []
    original = keras.Model.get_metrics_result

    def counted(self):
        if not in_stateless_scope():
            calls.append(1)
        return original(self)

    monkeypatch.setattr(keras.Model, "get_metrics_result", counted)
    return calls


@pytest.mark.parametrize("spe", [1, 3])
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_epoch_logs_are_the_last_steps_and_equal_keras_alone(eager_results, name, spe):
    alone = _fit(None, spe)
    assert len(eager_results) == 3  # Keras alone recomputes once per epoch
    eager_results.clear()
    history = _fit(STRATEGIES[name](), spe)
    assert eager_results == []  # answered from the last step's logs
    assert sorted(history) == sorted(alone)
    for key, values in history.items():
        assert all(type(value) is float for value in values), (key, values)
        np.testing.assert_allclose(values, alone[key], rtol=1e-5, err_msg=key)


class _ResetAfterEachBatch(keras.callbacks.Callback):
    """Changes the metric variables after the step that computed the logs."""

    def on_train_batch_end(self, batch, logs=None):
        self.model.reset_metrics()


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_metrics_changed_after_the_last_step_are_read_back_as_keras_does(eager_results, name):
    alone = _fit(None, 1, [_ResetAfterEachBatch()])
    eager_results.clear()
    history = _fit(STRATEGIES[name](), 1, [_ResetAfterEachBatch()])
    assert len(eager_results) == 3  # the step's logs no longer describe the variables
    assert alone["loss"] == [0.0, 0.0, 0.0]  # what Keras reports for reset metrics
    for key, values in history.items():
        np.testing.assert_allclose(values, alone[key], rtol=1e-5, err_msg=key)
