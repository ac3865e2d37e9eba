"""``sx.callbacks.WorkerMetrics``: what it reports, and that it changes nothing that is trained."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.observe import record as record_mod
from stratax.callbacks import WorkerMetrics


@pytest.fixture(autouse=True)
def _close_writers():
    yield
    record_mod.close_all()


def _model(strategy):
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("devices", [1, 2])
def test_reports_speed_and_leaves_training_unchanged(tmp_path, devices):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(512, 6)).astype(np.float32), rng.integers(0, 3, 512)
    strategy = (sx.OneDeviceStrategy("cpu:0") if devices == 1
                else sx.MirroredStrategy([f"cpu:{i}" for i in range(devices)]))
    plain = _model(strategy)
    plain_history = plain.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0).history
    observed = _model(strategy)
    callback = WorkerMetrics(tmp_path, task="worker_0", every_seconds=1e-4)
    history = observed.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
                           callbacks=[callback]).history
    for got, want in zip(observed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(history["loss"], plain_history["loss"], rtol=1e-6)
    assert observed.train_function != callback._timed_train_function  # restored after fit

    records = _records(tmp_path / "metrics" / "worker_0.jsonl")
    windows = [r for r in records if "step_s" in r]
    epochs = [r for r in records if r.get("epoch_end")]
    assert len(windows) >= 10  # a tiny window: about one report per step
    steps = [r["step"] for r in windows]
    assert steps == sorted(steps) and steps[-1] <= 48  # 512 / 32 * 3 steps
    for r in windows:
        assert r["step_s"] > 0 and r["input_s"] >= 0 and r["input_s"] < r["step_s"]
        # samples/s is rows per window over its time: 32 rows per step here.
        assert r["samples_per_s"] == pytest.approx(32 / r["step_s"], rel=1e-6)
    assert [r["epoch"] for r in epochs] == [0, 1, 2]
    np.testing.assert_allclose([r["loss"] for r in epochs], history["loss"], rtol=1e-6)
    if devices == 1:
        assert "collective_s" not in windows[0]  # no all-reduce with one replica
        assert "synchronous" not in windows[0]
    else:
        assert windows[0]["collective_s"] > 0 and windows[0]["collective_estimated"] == 1
        assert windows[0]["synchronous"] == 1


def test_needs_a_run_dir(monkeypatch):
    monkeypatch.delenv("STRATAX_RUN_DIR", raising=False)
    with pytest.raises(ValueError, match="WorkerMetrics needs a run directory"):
        WorkerMetrics()
    with pytest.raises(ValueError, match="every_seconds must be a number > 0, got 0"):
        WorkerMetrics("/tmp/x", every_seconds=0)


def test_fit_reports_by_itself_when_the_run_has_a_directory(tmp_path, monkeypatch):
    """`stratax launch --dashboard` sets STRATAX_RUN_DIR: fit then reports without the user
    adding WorkerMetrics, and a WorkerMetrics of the user's is not doubled."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(256, 6)).astype(np.float32), rng.integers(0, 3, 256)
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    monkeypatch.delenv("STRATAX_RUN_DIR", raising=False)
    _model(strategy).fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert not (tmp_path / "metrics").exists()

    monkeypatch.setenv("STRATAX_RUN_DIR", str(tmp_path / "auto"))
    monkeypatch.setenv("STRATAX_TASK_NAME", "worker_0")
    _model(strategy).fit(x, y, batch_size=32, epochs=2, verbose=0)
    records = _records(tmp_path / "auto" / "metrics" / "worker_0.jsonl")
    assert [r["epoch"] for r in records if r.get("epoch_end")] == [0, 1]
    assert any(r.get("step_s", 0) > 0 for r in records)

    mine = WorkerMetrics(tmp_path / "mine", task="worker_0")
    model = _model(strategy)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0,
              callbacks=keras.callbacks.CallbackList([mine], add_history=True, model=model))
    assert [r["epoch"] for r in _records(tmp_path / "mine" / "metrics" / "worker_0.jsonl")
            if r.get("epoch_end")] == [0]
    assert len(_records(tmp_path / "auto" / "metrics" / "worker_0.jsonl")) == len(records)


class _CrashAt(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise RuntimeError("simulated crash")


@pytest.mark.parametrize("metrics_first", [False, True])
def test_steps_continue_from_the_step_a_backup_restored(tmp_path, metrics_first):
    """A run that crashed at step 21 (16 steps per epoch, backups every 5 steps) and resumed
    through BackupAndRestore numbers its reports from the restored global step 20 on, up to
    the run's 48 steps, not from the 4 steps done in the resumed epoch; in either order of
    the callbacks."""
    from stratax._src.checkpoint import versions
    from stratax._src.keras.callbacks.backup import wait_for_writes

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(512, 6)).astype(np.float32), rng.integers(0, 3, 512)
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    backup, run_dir = str(tmp_path / "backup"), tmp_path / "run"

    def callbacks(*extra):
        metrics = WorkerMetrics(run_dir, task="worker_0", every_seconds=1e-4, probe_repeats=0)
        ordered = [metrics, sx.BackupAndRestore(backup, save_freq=5)]
        return [*(ordered if metrics_first else ordered[::-1]), *extra]

    with pytest.raises(RuntimeError, match="simulated crash"):
        _model(strategy).fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
                             callbacks=callbacks(_CrashAt(21)))
    wait_for_writes(backup)
    assert versions.load(backup)[1]["global_step"] == 20
    record_mod.close_all()
    crashed = _records(run_dir / "metrics" / "worker_0.jsonl")

    _model(strategy).fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
                         callbacks=callbacks())
    resumed = _records(run_dir / "metrics" / "worker_0.jsonl")[len(crashed):]
    assert crashed[0]["fit_begin"] == 1 and crashed[0]["step"] == 0
    assert (resumed[0]["fit_begin"], resumed[0]["step"], resumed[0]["epoch"]) == (1, 20, 1)
    steps = [r["step"] for r in resumed if "step_s" in r]
    assert steps == sorted(steps) and steps[0] > 20 and steps[-1] == 48
    assert [(r["epoch"], r["step"]) for r in resumed if r.get("epoch_end")] == [(1, 32), (2, 48)]
