"""``sx.callbacks.TensorBoard`` writes TensorBoard events without TensorFlow; read back and
compared with Keras' History, under several strategies."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import stratax as sx
from stratax.callbacks import TensorBoard

# Imported at collection: tensorboardX sets CRC32C_SW_MODE in os.environ on import.
pytest.importorskip("tensorboardX", reason="sx.callbacks.TensorBoard needs tensorboardX: "
                    "pip install 'stratax[tensorboard]'")
event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the test reads events with TensorBoard's EventAccumulator: pip install tensorboard")


def _events(path):
    acc = event_accumulator.EventAccumulator(str(path), size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0,
        event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def _scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _model(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return model


STRATEGIES = {
    "one_device": lambda: sx.OneDeviceStrategy("cpu:0"),
    "mirrored_2": lambda: sx.MirroredStrategy(["cpu:0", "cpu:1"]),
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_scalars_histograms_and_learning_rate_equal_history(tmp_path, name):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 6)).astype(np.float32), rng.integers(0, 3, 96)
    model = _model(STRATEGIES[name]())
    callback = TensorBoard(tmp_path, histogram_freq=1, update_freq=2)
    history = model.fit(x, y, batch_size=16, epochs=3, validation_split=0.25, verbose=0,
                        callbacks=[callback]).history

    train = _events(tmp_path / "train")
    for metric in ("loss", "accuracy"):
        steps, values = zip(*_scalars(train, f"epoch_{metric}"), strict=True)
        assert steps == (0, 1, 2)
        np.testing.assert_allclose(values, history[metric], rtol=1e-6)
    assert [v for _, v in _scalars(train, "epoch_learning_rate")] == pytest.approx([0.01] * 3)
    # Batch-level: 72 training rows / 16 = 5 batches per epoch (last partial), every 2nd batch.
    assert [s for s, _ in _scalars(train, "batch_loss")] == [2, 4, 6, 8, 10, 12, 14]
    kernel_tag = f"{model.layers[0].kernel.path}/histogram"
    assert kernel_tag in train.Tags()["histograms"]
    histograms = train.Histograms(kernel_tag)
    assert [h.step for h in histograms] == [0, 1, 2]
    last = histograms[-1].histogram_value
    kernel = model.layers[0].kernel.numpy()
    assert last.num == kernel.size
    assert last.min == pytest.approx(kernel.min()) and last.max == pytest.approx(kernel.max())
    assert last.sum == pytest.approx(kernel.sum(), rel=1e-5, abs=1e-5)
    assert "keras_model/config/text_summary" in train.Tags()["tensors"]

    validation = _events(tmp_path / "validation")
    np.testing.assert_allclose([v for _, v in _scalars(validation, "epoch_loss")],
                               history["val_loss"], rtol=1e-6)
    steps = [s for s, _ in _scalars(validation, "evaluation_loss_vs_iterations")]
    assert steps == [5, 10, 15]  # optimizer iterations at each validation


def test_unsupported_arguments_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not support write_images=True"):
        TensorBoard(tmp_path, write_images=True)
    with pytest.raises(ValueError, match=r"jax\.profiler\.trace"):
        TensorBoard(tmp_path, profile_batch=2)
    with pytest.raises(ValueError, match="update_freq must be 'epoch', 'batch' or an int"):
        TensorBoard(tmp_path, update_freq="step")
