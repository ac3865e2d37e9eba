"""A ``PyDataset``'s ``workers`` and ``use_multiprocessing`` are honoured (issue 49 #5).

stratax read every ``PyDataset`` by index in the main process; plain Keras reads one that asks
for workers through its pool of threads or processes. Now stratax does too (Keras' own
``OrderedEnqueuer``, in the order stratax chose): the batches come from the workers, and
training equals plain Keras reading in the main process to 1e-6. Processes start from
multiprocessing's ``forkserver``, never a fork of this JAX process; the errors for a dataset that
does not pickle and a script that trains at import are tested too.
"""

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import keras
import numpy as np
import pytest

import stratax as sx

ROWS, BATCH = 48, 8


class Recorded(keras.utils.PyDataset):
    """Batches by index; each read appends ``<pid> <thread name>`` to ``log``."""

    def __init__(self, log, **kwargs):
        super().__init__(**kwargs)
        self.log = str(log)
        self.x = np.linspace(-1, 1, ROWS * 3, dtype="float32").reshape(ROWS, 3)
        self.y = np.sin(self.x.sum(axis=1, keepdims=True))

    def __len__(self):
        return ROWS // BATCH

    def __getitem__(self, index):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {threading.current_thread().name}\n")
        rows = slice(index * BATCH, (index + 1) * BATCH)
        return self.x[rows], self.y[rows]


def _fit(strategy, dataset, shuffle=False):
    with strategy.scope() if strategy is not None else _nothing():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    model.set_weights([np.linspace(-1, 1, w.size, dtype="float32").reshape(w.shape)
                       for w in model.get_weights()])
    model.fit(dataset, epochs=2, shuffle=shuffle, verbose=0)
    return model.get_weights()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _readers(log):
    return [line.split(" ", 1) for line in log.read_text().splitlines()]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("replicas", [0, 2])
def test_worker_threads_read_the_batches_and_training_equals_plain_keras(tmp_path, replicas):
    strategy = (sx.OneDeviceStrategy("cpu:0") if replicas == 0
                else sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)]))
    log = tmp_path / "reads.txt"
    got = _fit(strategy, Recorded(log, workers=2))
    readers = _readers(log)
    assert all(pid == str(os.getpid()) for pid, _ in readers)
    # Keras' pool threads read every batch of fit (the build's peek may be one more).
    assert sum(name != "MainThread" for _, name in readers) >= 2 * (ROWS // BATCH)
    # Plain Keras reading in the main process: with workers, plain Keras 3.15's own result
    # differs from its one-reader result on this model (Keras' behaviour, not stratax's).
    plain = _fit(None, Recorded(tmp_path / "plain.txt"))
    for a, b in zip(got, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.fixture
def forkserver():
    """Stops multiprocessing's forkserver and resource tracker after the test (a program keeps
    them until it exits; the suite checks that no test leaves a child process)."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    yield
    gc.collect()  # the pools' queues first: their semaphores are the tracker's to unlink
    multiprocessing.forkserver._forkserver._stop()
    multiprocessing.resource_tracker._resource_tracker._stop()


@pytest.mark.timeout(120)
def test_worker_processes_read_the_batches(tmp_path, forkserver):
    """``use_multiprocessing=True``: worker processes read the batches, started from
    multiprocessing's ``forkserver`` (a fork of this process, which runs JAX's threads, can
    deadlock), and training equals plain Keras reading in the main process."""
    log = tmp_path / "reads.txt"
    got = _fit(sx.OneDeviceStrategy("cpu:0"), Recorded(log, workers=2, use_multiprocessing=True))
    plain = _fit(None, Recorded(tmp_path / "plain.txt"))
    for a, b in zip(got, plain, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    readers = {pid for pid, _ in _readers(log)} - {str(os.getpid())}
    assert readers  # read by the worker processes
    assert all(int(pid) not in _children_forked_from_here() for pid in readers)


def _children_forked_from_here():
    """Pids of this process' direct children (forkserver's workers are the server's)."""
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    return {int(pid) for pid in children.read_text().split()} if children.exists() else set()


class _Unpicklable(Recorded):
    def __init__(self, log, **kwargs):
        super().__init__(log, **kwargs)
        self.transform = lambda batch: batch


@pytest.mark.timeout(60)
def test_an_unpicklable_dataset_names_the_fix(tmp_path, forkserver):
    with pytest.raises(ValueError, match=r"(?s)worker processes of _Unpicklable failed.*"
                                         r"pickl.*use_multiprocessing=False"):
        _fit(sx.OneDeviceStrategy("cpu:0"),
             _Unpicklable(tmp_path / "reads.txt", workers=2, use_multiprocessing=True))


_UNGUARDED = """
import stratax as sx
import keras
import numpy as np


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 2

    def __getitem__(self, index):
        return np.ones((4, 3), "float32"), np.ones((4, 1), "float32")


with sx.OneDeviceStrategy("cpu:0").scope():  # training at import, no __main__ guard
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
model.fit(Batches(workers=2, use_multiprocessing=True), verbose=0)
"""


@pytest.mark.timeout(150)
def test_a_script_that_trains_at_import_gets_the_fix_not_a_hang(tmp_path):
    """Its worker processes import the script and train in turn; multiprocessing would replace
    them endlessly while fit waits for a batch."""
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=140, check=False, cwd=tmp_path)
    assert done.returncode != 0
    error = "RuntimeError: The worker processes of Batches died while starting"
    assert error in done.stderr, done.stderr[-3000:]
    assert 'training under `if __name__ == "__main__":`' in done.stderr


def test_a_script_importing_in_a_child_does_not_join_the_cluster(monkeypatch):
    """A forkserver or spawn child re-imports the main script: an unguarded
    ``MultiWorkerMirroredStrategy()`` there would join the cluster a second time."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match=r'if __name__ == "__main__"'):
        sx.MultiWorkerMirroredStrategy()


@pytest.mark.timeout(60)
def test_shuffled_order_is_the_one_reader_order(tmp_path):
    """stratax's (seed, epoch) order of batches, whoever reads them."""
    keras.utils.set_random_seed(3)
    one = _fit(sx.OneDeviceStrategy("cpu:0"), Recorded(tmp_path / "a.txt"), shuffle=True)
    keras.utils.set_random_seed(3)
    pool = _fit(sx.OneDeviceStrategy("cpu:0"), Recorded(tmp_path / "b.txt", workers=3),
                shuffle=True)
    for a, b in zip(one, pool, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert any(name != "MainThread" for _, name in _readers(tmp_path / "b.txt"))
