"""``fit`` places batches ahead of the step in a background thread, unless told not to."""

import threading

import keras
import numpy as np
import pytest

import stratax as sx


class _PrefetchThreads(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = set()

    def on_train_batch_end(self, batch, logs=None):
        self.seen |= {t.name for t in threading.enumerate() if t.name == "stratax-prefetch"}


def _fit(x, strategy, **kwargs):
    keras.utils.set_random_seed(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    probe = _PrefetchThreads()
    model.fit(x, epochs=2, verbose=0, callbacks=[probe], **kwargs)
    return model.get_weights(), probe.seen


@pytest.mark.parametrize("fetch", [True, False])
def test_fetch_to_device_option_switches_the_prefetch_thread(fetch):
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(8, 4)).astype(np.float32),
                rng.normal(size=(8, 2)).astype(np.float32)) for _ in range(5)]
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    options = sx.InputOptions(experimental_fetch_to_device=fetch)
    weights, threads = _fit(strategy.experimental_distribute_dataset(batches, options), strategy)
    assert bool(threads) is fetch
    reference, _ = _fit(batches, sx.OneDeviceStrategy("cpu:0"))
    for got, want in zip(weights, reference, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_prefetch_depth_default_on_cpu_and_from_the_environment(monkeypatch):
    x, y = np.ones((16, 4), np.float32), np.ones((16, 2), np.float32)
    monkeypatch.delenv("STRATAX_PREFETCH_DEPTH", raising=False)
    _, threads = _fit(x, sx.MirroredStrategy(["cpu:0", "cpu:1"]), y=y, batch_size=8)
    assert not threads  # on CPU the thread would compete with the step for the cores
    monkeypatch.setenv("STRATAX_PREFETCH_DEPTH", "2")
    _, threads = _fit(x, sx.MirroredStrategy(["cpu:0", "cpu:1"]), y=y, batch_size=8)
    assert threads
    monkeypatch.setenv("STRATAX_PREFETCH_DEPTH", "two")
    with pytest.raises(ValueError, match="STRATAX_PREFETCH_DEPTH='two' is not an integer >= 0"):
        _fit(x, sx.OneDeviceStrategy("cpu:0"), y=y, batch_size=8)
