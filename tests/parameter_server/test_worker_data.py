"""Arrays held by workers (``worker_data``) and the metrics rule of ``fit`` under PSS, in one
process: the checks that need no cluster."""

import keras
import numpy as np
import pytest

from stratax._src.keras.steps.ps_steps import check_additive_metrics
from stratax._src.parameter_server.inputs.worker_data import ArrayStore


def test_array_store_cuts_batches_by_rows_and_checks_them():
    store = ArrayStore()
    x, y = np.arange(20, dtype=np.float32).reshape(10, 2), np.arange(10, dtype=np.int32)
    store.put("a", [x, y])
    (bx, by), (cx, cy) = store.batches("a", [np.array([3, 1]), np.array([9])])
    assert np.array_equal(bx, x[[3, 1]]) and np.array_equal(by, [3, 1])
    assert np.array_equal(cx, x[[9]]) and np.array_equal(cy, [9])
    (half,) = store.batches("a", [np.array([0, 1, 2, 3])], part=1, parts=2)  # sync: 2nd half
    assert np.array_equal(half[1], [2, 3])
    with pytest.raises(ValueError, match="equal parts"):
        store.batches("a", [np.array([0, 1, 2])], part=1, parts=2)
    with pytest.raises(ValueError, match=r"0\.\.9"):
        store.batches("a", [np.array([10])])
    with pytest.raises(ValueError, match=r"0\.\.9"):
        store.batches("a", [np.array([0.5])])
    with pytest.raises(ValueError, match="same rows"):
        store.put("b", [x, y[:5]])
    store.drop("a")
    with pytest.raises(KeyError, match="No arrays 'a'"):
        store.batches("a", [np.array([0])])


def _compiled(metrics):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=metrics)
    model.evaluate(np.zeros((4, 3), np.float32), np.zeros((4, 1), np.float32), verbose=0)
    return model


def test_metrics_rule_accepts_keras_metrics_and_declared_custom_ones():
    class Last(keras.metrics.Metric):                 # keeps the last value: not additive
        def __init__(self, name="last"):
            super().__init__(name=name)
            self.value = self.add_weight(name="v", shape=(), initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.value.assign(keras.ops.mean(y_pred))

        def result(self):
            return self.value + 0.0

    check_additive_metrics(_compiled(["accuracy", keras.metrics.AUC(),
                                      keras.metrics.TruePositives()]))
    custom = Last()
    model = _compiled([custom])
    with pytest.raises(ValueError, match="'last' \\(Last\\) defines its own update_state"):
        check_additive_metrics(model)
    custom.stratax_additive = True
    check_additive_metrics(model)
