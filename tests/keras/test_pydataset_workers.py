"""A ``PyDataset``'s ``workers`` and ``use_multiprocessing`` are honoured (issue 49 #5).

stratax read every ``PyDataset`` by index in the main process; plain Keras reads one that asks
for workers through its pool of threads or processes. Now stratax does too (Keras' own
``OrderedEnqueuer``, in the order stratax chose): the batches come from the workers, and
training equals plain Keras reading in the main process to 1e-6.
"""

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


_IN_PROCESSES = """
import os, sys
sys.path.insert(0, {here!r})
import numpy as np
import stratax as sx
from test_pydataset_workers import Recorded, _fit
got = _fit(sx.OneDeviceStrategy("cpu:0"), Recorded({log!r}, workers=2, use_multiprocessing=True))
want = _fit(None, Recorded({log!r} + ".plain"))
assert all(np.allclose(a, b, rtol=1e-6, atol=1e-6) for a, b in zip(got, want))
print("main", os.getpid())
"""


@pytest.mark.slow  # Keras' process pool forks a process that runs JAX, as plain Keras does
@pytest.mark.timeout(120)
def test_worker_processes_read_the_batches(tmp_path):
    """``use_multiprocessing=True``: Keras' pool of forked processes reads the batches. Run in
    a fresh process with a time limit: a fork of a process with many threads (a whole test
    session) can deadlock, JAX warns, for plain Keras too."""
    log = tmp_path / "reads.txt"
    program = _IN_PROCESSES.format(here=str(Path(__file__).parent), log=str(log))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=100, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    main = done.stdout.split("main ")[1].split()[0]
    assert {pid for pid, _ in _readers(log)} - {main}  # read by the worker processes


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
