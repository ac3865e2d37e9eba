"""``Model.reset_metrics``: Keras' own zeroing resets run as one program of placed zeros.

The result must be Keras' own reset, variable for variable: zeros where Keras' ``Metric``,
``Mean`` or ``Sum`` reset would write them, a metric's own ``reset_state`` run as written
otherwise, and variables a zeroing reset leaves alone left alone.
"""

import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.keras.steps import metric_reset

STRATEGIES = {
    "one device": lambda: sx.OneDeviceStrategy("cpu:0"),
    "2 replicas": lambda: sx.MirroredStrategy(["cpu:0", "cpu:1"]),
}


class ResetToOnes(keras.metrics.Metric):
    """A metric with a reset of its own (to ones): it must run as written."""

    def __init__(self) -> None:
        super().__init__(name="ones")
        self.level = self.add_variable(shape=(3,), initializer="ones", name="level")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.level.assign(self.level + 1.0)

    def result(self):
        return keras.ops.sum(self.level)

    def reset_state(self):
        self.level.assign(keras.ops.ones((3,)))


class MeanWithExtra(keras.metrics.Mean):
    """Keras' ``Mean.reset_state`` (inherited) resets ``total`` and ``count`` only."""

    def __init__(self) -> None:
        super().__init__(name="mean_extra")
        self.extra = self.add_variable(shape=(), initializer="zeros", name="extra")

    def update_state(self, values, sample_weight=None):
        self.extra.assign(self.extra + 5.0)
        return super().update_state(values, sample_weight)


class TwoSums(keras.metrics.Metric):
    """Base ``Metric.reset_state``: every variable, including a sub-metric's, goes to zero."""

    def __init__(self) -> None:
        super().__init__(name="two_sums")
        self.a = self.add_variable(shape=(2,), initializer="zeros", name="a")
        self.inner = keras.metrics.Sum(name="inner")

    def update_state(self, values, sample_weight=None):
        self.a.assign(self.a + 2.0)
        self.inner.update_state(values)

    def result(self):
        return keras.ops.sum(self.a) + self.inner.result()


class Custom(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(2)
        self.tracker = keras.metrics.Mean(name="loss")
        self.extra_mean = MeanWithExtra()
        self.ones = ResetToOnes()
        self.two_sums = TwoSums()
        self.total = keras.metrics.Sum(name="total")
        self.half = keras.metrics.Sum(name="half", dtype="bfloat16")

    def call(self, x):
        return self.dense(x)

    @property
    def metrics(self):
        return [self.tracker, self.extra_mean, self.ones, self.two_sums, self.total,
                self.half]


def _model(strategy):
    with strategy.scope():
        model = Custom()
        model(np.zeros((4, 3), np.float32))
        for metric in model.metrics:
            metric.update_state(np.float32([1.0, 2.0]), np.float32([0.5, 0.5]))
    return model


def _values(model):
    return {v.path: np.asarray(v.value) for v in model.metrics_variables}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_reset_equals_keras_own_and_keeps_placements(name):
    model = _model(STRATEGIES[name]())
    placed = {v.path: v.value.sharding for v in model.metrics_variables}
    before = _values(model)
    assert before["mean_extra/extra"] == 5.0 and before["ones/level"].tolist() == [2.0] * 3
    model.reset_metrics()
    after = _values(model)
    assert after["mean_extra/extra"] == 5.0  # Mean's own reset leaves it alone
    assert after["ones/level"].tolist() == [1.0] * 3  # its own reset ran
    for path, value in after.items():
        if path not in ("mean_extra/extra", "ones/level"):
            assert not value.any(), path
            assert value.dtype == before[path].dtype, path
    assert {v.path: v.value.sharding for v in model.metrics_variables} == placed

    reference = _model(STRATEGIES[name]())  # Keras' own reset, metric by metric
    for metric in reference.metrics:
        metric.reset_state()
    for path, value in _values(reference).items():
        np.testing.assert_array_equal(after[path], value, err_msg=path)


def test_zeroing_resets_share_one_cached_program(monkeypatch):
    model = _model(STRATEGIES["2 replicas"]())
    metric_reset._zeros_program.cache_clear()
    eager = []
    original = keras.metrics.Mean.reset_state
    monkeypatch.setattr(keras.metrics.Mean, "reset_state",
                        lambda self: eager.append(self) or original(self))
    model.reset_metrics()  # Mean's reset is no longer Keras' own: it runs as written
    assert len(eager) == 2
    monkeypatch.undo()
    model.reset_metrics()
    model.reset_metrics()
    info = metric_reset._zeros_program.cache_info()
    assert (info.misses, info.hits) == (2, 1)


def test_fit_resets_every_epoch_as_keras_alone():
    """The loss tracker and compiled metrics start each epoch from zero: per-epoch logs equal
    Keras alone's (a reset that did not happen would carry the sums over)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = rng.integers(0, 3, 64)

    def fit(strategy):
        keras.utils.set_random_seed(5)
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
            model.compile(optimizer="sgd", metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0).history

    keras.utils.set_random_seed(5)
    alone = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    alone.compile(optimizer="sgd", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    expected = alone.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0).history
    for name in sorted(STRATEGIES):
        history = fit(STRATEGIES[name]())
        for key in ("loss", "accuracy"):
            np.testing.assert_allclose(history[key], expected[key], rtol=1e-5, err_msg=name)
