"""Bad array input to fit/evaluate: the error plain Keras raises, under every strategy."""

import keras
import numpy as np
import pytest

import stratax as sx

STRATEGIES = {
    "one_device": lambda: sx.OneDeviceStrategy("/cpu:0"),
    "mirrored_2": lambda: sx.MirroredStrategy(["/cpu:0", "/cpu:1"]),
}


def _model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def _error(model, method, x, y, **kwargs):
    with pytest.raises(ValueError) as err:
        getattr(model, method)(x, y, batch_size=8, verbose=0, **kwargs)
    return str(err.value)


@pytest.mark.parametrize("method", ["fit", "evaluate"])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_x_and_y_of_different_lengths_raise_keras_cardinality_error(name, method):
    # Before: IndexError: index 503 is out of bounds for axis 0 with size 503 under Mirrored.
    x = np.zeros((504, 4), np.float32)
    y = np.zeros((503, 2), np.float32)
    want = _error(_model(), method, x, y)
    assert "Data cardinality is ambiguous" in want and "'y' sizes: 503" in want
    with STRATEGIES[name]().scope():
        model = _model()
    assert _error(model, method, x, y) == want
    w = np.ones(500, np.float32)
    assert _error(model, method, x[:503], y, sample_weight=w) == _error(
        _model(), method, x[:503], y, sample_weight=w)
