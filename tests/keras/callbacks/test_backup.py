"""Step-level BackupAndRestore in one process, preemption by SIGTERM, and atomic saves."""

import errno
import os
import re
import shutil
import signal
import subprocess

import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.checkpoint import sharded_state, versions
from stratax._src.keras.callbacks.backup import wait_for_writes


def _data():
    rng = np.random.default_rng(1)
    return rng.normal(size=(120, 8)).astype(np.float32), rng.integers(0, 3, 120)


def _model(strategy, named=False):
    """The test model; ``named`` gives it fixed names (the same variable paths when rebuilt)."""
    keras.utils.set_random_seed(5)
    names = ({"name": "net"}, {"name": "hidden"}, {"name": "drop"}, {"name": "out"}) \
        if named else ({},) * 4
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)),
                                  keras.layers.Dense(16, activation="relu", **names[1]),
                                  keras.layers.Dropout(0.3, **names[2]),
                                  keras.layers.Dense(3, **names[3])], **names[0])
        model.compile(optimizer="adam", metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _FailAt(keras.callbacks.Callback):
    def __init__(self, step, action):
        super().__init__()
        self.step, self.action, self.seen = step, action, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            self.action()


def _raise():
    raise RuntimeError("simulated crash")


@pytest.mark.parametrize("crash_step", [5, 16, 24])
def test_resume_mid_epoch_equals_uninterrupted(tmp_path, crash_step):
    """8 steps per epoch, backups every 3 steps, shuffled data and dropout: exact resume."""
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    x, y = _data()
    reference = _model(strategy)
    reference.fit(x, y, batch_size=16, epochs=3, verbose=0,
                  callbacks=[sx.BackupAndRestore(str(tmp_path / "ref"), save_freq=3)])
    crashed = _model(strategy)
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="simulated crash"):
        crashed.fit(x, y, batch_size=16, epochs=3, verbose=0,
                    callbacks=[sx.BackupAndRestore(backup, save_freq=3),
                               _FailAt(crash_step, _raise)])
    wait_for_writes(backup)  # the write in flight when fit raised completes by itself
    assert versions.latest_version(backup) is not None
    resumed = _model(strategy)
    resumed.fit(x, y, batch_size=16, epochs=3, verbose=0,
                callbacks=[sx.BackupAndRestore(backup, save_freq=3)])
    for got, want in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    assert versions.latest_version(backup) is None  # deleted when training completed


def test_sigterm_saves_and_exits_with_preemption_code(tmp_path):
    strategy = sx.OneDeviceStrategy("cpu:0")
    x, y = _data()
    backup = str(tmp_path / "backup")
    preempted = _model(strategy)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:
        preempted.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
            sx.BackupAndRestore(backup, save_freq=100),
            _FailAt(6, lambda: os.kill(os.getpid(), signal.SIGTERM))])
    signal.signal(signal.SIGTERM, previous)
    assert exit_info.value.code == sx.PREEMPTION_EXIT_CODE
    _, meta = versions.load(backup)
    # SIGTERM arrived after step 6's backup check: the workers stop at the next step.
    assert (meta["epoch"], meta["steps_in_epoch"]) == (0, 7)
    resumed = _model(strategy)
    resumed.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[sx.BackupAndRestore(backup)])
    reference = _model(strategy)
    reference.fit(x, y, batch_size=16, epochs=2, verbose=0,
                  callbacks=[sx.BackupAndRestore(str(tmp_path / "ref"))])
    for got, want in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def _crash_and_rewrite(tmp_path, strategy, rewrite, named=False, write=versions.save):
    """Trains 2 epochs with a crash at step 10 (backups every 4), lets ``rewrite(arrays, meta)``
    change the backup (written again by ``write(directory, arrays, meta)``), resumes, and
    checks the result equals an uninterrupted run."""
    x, y = _data()
    reference = _model(strategy, named)
    reference.fit(x, y, batch_size=16, epochs=2, verbose=0,
                  callbacks=[sx.BackupAndRestore(str(tmp_path / "ref"), save_freq=4)])
    backup = tmp_path / "backup"
    with pytest.raises(RuntimeError, match="simulated crash"):
        _model(strategy, named).fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[
            sx.BackupAndRestore(str(backup), save_freq=4), _FailAt(10, _raise)])
    wait_for_writes(str(backup))
    arrays, meta = versions.load(backup)
    write(backup, *rewrite(arrays, meta))
    resumed = _model(strategy, named)
    resumed.fit(x, y, batch_size=16, epochs=2, verbose=0,
                callbacks=[sx.BackupAndRestore(str(backup), save_freq=4)])
    for got, want in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    return arrays


def test_backup_entries_are_named_by_variable_path(tmp_path):
    """Entries are ``model/<path>``, ``optimizer/<path>``, ``metrics/<path>`` in a plain npz
    that numpy reads by name."""
    arrays = _crash_and_rewrite(tmp_path, sx.OneDeviceStrategy("cpu:0"), named=True,
                                rewrite=lambda a, m: (a, m))
    assert list(arrays)[:2] == ["model/net/hidden/kernel", "model/net/hidden/bias"]
    assert any(re.fullmatch(r"optimizer/adam(_\d+)?/net_out_bias_velocity", name)
               for name in arrays), list(arrays)
    assert any(name.startswith("metrics/") for name in arrays), list(arrays)
    assert arrays["model/net/out/kernel"].shape == (16, 3)


def test_a_backup_of_the_positional_format_still_resumes_exactly(tmp_path):
    """Backups written before entries had names (``arr_0``, ``arr_1``, ..., format 1)."""
    def positional(arrays, meta):
        return ({f"arr_{i}": a for i, a in enumerate(arrays.values())},
                {**meta, "format": 1, "shapes": [list(a.shape) for a in arrays.values()]})

    _crash_and_rewrite(tmp_path, sx.OneDeviceStrategy("cpu:0"), positional)


def _write_as_two_processes(backup, arrays, meta):
    """Writes ``arrays`` as 2 processes write state held in parts: each matrix split by rows,
    each half in its own process's files (``p<i>-<n>.npy``, ``p<i>.json``), the rest whole."""
    staging = backup / ".staging-sharded-test"
    staging.mkdir()
    matrices = [name for name, a in arrays.items() if a.ndim == 2]
    for process in (0, 1):
        parts = {}
        for name in matrices:
            whole, half = arrays[name], arrays[name].shape[0] // 2
            start = 0 if process == 0 else half
            rows = whole[:half] if process == 0 else whole[half:]
            parts[name] = sharded_state.Parts(whole.shape, whole.dtype.name, [((start, 0), rows)])
        sharded_state._write_pieces(staging, process, parts)
    meta = {**meta, "processes": 2, "order": list(arrays),
            "sharded": {name: {"shape": list(arrays[name].shape), "dtype": "float32"}
                        for name in matrices}}
    version = versions._commit(backup, {n: a for n, a in arrays.items()
                                             if n not in matrices}, meta, staging)
    with np.load(version / "state.npz") as whole_arrays:
        assert not set(whole_arrays.files) & set(matrices)


def test_a_backup_written_in_parts_by_two_processes_resumes_in_one(tmp_path):
    """A backup of state held in parts (model parallelism over 2 workers) restores into one
    process whole, and the run ends as the uninterrupted one; the multi-process writes are
    tests/multiprocess/test_sharded_state.py's."""
    arrays = _crash_and_rewrite(tmp_path, sx.OneDeviceStrategy("cpu:0"),
                                lambda arrays, meta: (arrays, meta),
                                write=_write_as_two_processes)
    assert sum(a.ndim == 2 for a in arrays.values()) == 6  # 2 kernels, with Adam's m and v


def test_save_weights_is_atomic(tmp_path, monkeypatch):
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    model = _model(strategy)
    path = tmp_path / "model.weights.h5"
    model.save_weights(str(path))
    before = path.read_bytes()
    from keras.src.saving import saving_lib

    def crash(*args, **kwargs):
        raise OSError("crash in the middle of writing")

    monkeypatch.setattr(saving_lib, "save_weights_only", crash)
    with pytest.raises(OSError, match="crash in the middle"):
        model.save_weights(str(path))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["model.weights.h5"]


def test_mismatched_backup_and_bad_arguments(tmp_path):
    strategy = sx.OneDeviceStrategy("cpu:0")
    x, y = _data()
    versions.save(tmp_path, {"arr_0": np.zeros(2)},
                       {"format": 1, "epoch": 0, "steps_in_epoch": 0, "global_step": 0})
    with pytest.raises(ValueError, match="does not match this model"):
        _model(strategy).fit(x, y, batch_size=16, verbose=0,
                             callbacks=[sx.BackupAndRestore(str(tmp_path))])
    with pytest.raises(ValueError, match="save_freq"):
        sx.BackupAndRestore(str(tmp_path), save_freq=0)
    plain = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    plain.compile(optimizer="sgd", loss="mse")
    with pytest.raises(RuntimeError, match="needs a model built under a strategy scope"):
        plain.fit(x, np.zeros((120, 3)), verbose=0,
                  callbacks=[sx.BackupAndRestore(str(tmp_path / "other"))])


def test_backup_with_validation_data_trains_like_plain_fit(tmp_path):
    """fit's own validation ``evaluate`` gets a CallbackList; backups must not change training."""
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    x, y = _data()
    kwargs = {"batch_size": 16, "epochs": 2, "shuffle": False, "verbose": 0,
              "validation_data": (x[:30], y[:30])}
    with_backup = _model(strategy)
    history = with_backup.fit(x, y, callbacks=[sx.BackupAndRestore(str(tmp_path), save_freq=3)],
                              **kwargs)
    plain = _model(strategy)
    plain_history = plain.fit(x, y, **kwargs)
    assert history.history == plain_history.history
    for got, want in zip(with_backup.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


class _FillDisk(keras.callbacks.Callback):
    """After ``step`` batches, fills the disk at ``path`` with a file until it is full, once
    the background write to ``backup_dir`` in flight (the previous backup) is on disk."""

    def __init__(self, path, step, backup_dir):
        super().__init__()
        self.path, self.step, self.backup_dir, self.seen = path, step, backup_dir, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            wait_for_writes(str(self.backup_dir))
            with open(self.path, "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * 4096)
                except OSError as err:
                    assert err.errno == errno.ENOSPC


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("mount") is None,
                    reason="mounting a small tmpfs needs root")
def test_a_full_disk_during_a_backup_names_the_path_and_keeps_the_previous_one(tmp_path):
    # Before: a bare `[Errno 28] No space left on device` with no path.
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                      check=False, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        backup_dir = disk / "backup"
        model = _model(sx.OneDeviceStrategy("cpu:0"))
        x, y = _data()
        backup = sx.BackupAndRestore(str(backup_dir), save_freq=2)
        with pytest.raises(OSError) as err:   # backups after steps 2 and 4; the disk fills at 3
            model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False,
                      callbacks=[backup, _FillDisk(disk / "filler", 3, backup_dir)])
        assert err.value.errno == errno.ENOSPC
        assert str(err.value) == (
            f"[Errno 28] Could not write checkpoint {backup_dir}/ckpt-1 in {backup_dir}: No "
            f"space left on device; the previous checkpoint {backup_dir}/ckpt-0 is kept. Free "
            "space on that disk or choose another directory.")
        (disk / "filler").unlink()
        assert sorted(p.name for p in backup_dir.iterdir()) == ["ckpt-0", "latest"]
        assert versions.load(backup_dir)[1]["global_step"] == 2
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("background", [True, False])
def test_a_slow_write_does_not_stall_training_in_the_background(tmp_path, monkeypatch,
                                                                  background):
    """In the background the steps go on while a backup is written (the next save and the end
    of fit wait for it); with ``save_in_background=False`` the step that saves waits for it.
    Checked by the order of events, not by a clock: the background write holds until step 6
    has ended, which it would never see if the steps waited for it; how long a step stalls
    for a save is measured by ``python -m benchmarks.workloads.checkpoint``."""
    import threading

    real_save = versions.save
    events = []
    step_6_ended = threading.Event()

    def slow_save(*args):
        if background:
            events.append(("released", step_6_ended.wait(timeout=60)))
        events.append(("saved", None))
        return real_save(*args)

    def step_ended(batch, logs):
        events.append(("step", batch + 1))
        if batch + 1 == 6:
            step_6_ended.set()

    monkeypatch.setattr(versions, "save", slow_save)
    clock = keras.callbacks.LambdaCallback(on_train_batch_end=step_ended)
    x, y = _data()
    backup = sx.BackupAndRestore(str(tmp_path), save_freq=5, delete_checkpoint=False,
                                 save_in_background=background)
    _model(sx.OneDeviceStrategy("cpu:0")).fit(x[:96], y[:96], batch_size=16, verbose=0,
                                              callbacks=[backup, clock])
    saved = events.index(("saved", None))           # step 5's save
    if background:
        assert events[saved - 1] == ("released", True), events
        assert ("step", 6) in events[:saved], events
    else:
        assert events[saved - 1] == ("step", 4), events  # written inside step 5, before its end
        assert ("step", 5) in events[saved:], events
    assert versions.load(tmp_path)[1]["global_step"] == 5  # written before fit returned


def test_a_failed_background_write_raises_from_fit(tmp_path, monkeypatch):
    def broken_save(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(versions, "save", broken_save)
    x, y = _data()
    with pytest.raises(OSError, match="disk gone"):
        _model(sx.OneDeviceStrategy("cpu:0")).fit(x[:48], y[:48], batch_size=16, verbose=0,
                                                  callbacks=[sx.BackupAndRestore(
                                                      str(tmp_path), save_freq=2)])


