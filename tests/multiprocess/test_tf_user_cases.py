"""What a TensorFlow user trips on under MultiWorkerMirroredStrategy (issue 49), on 2 workers.

One launch of ``tf_user_program.py`` runs every case (the workers' start-up is the slow part);
each test reads its case's records and compares them with plain Keras in this process.
"""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import PROGRAMS, worker_env
from tf_user_program import shuffle_data, shuffle_model

import stratax as sx
from stratax._src import seam
from stratax._src.launch import launch

pytestmark = pytest.mark.timeout(240)

CASES = ("wrong_width", "seeded_shuffle", "unseeded_shuffled_fit", "tensorboard_and_checkpoint")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """``{case: [worker 0's record, worker 1's record]}`` of one two-worker launch."""
    out = tmp_path_factory.mktemp("tf_user")
    with pytest.MonkeyPatch.context() as patch:  # one CPU device per worker
        for name in ("STRATAX_CPU_DEVICES", "TF_CONFIG", "XLA_FLAGS"):
            patch.delenv(name, raising=False)
        result = launch([sys.executable, "tf_user_program.py", str(out), *CASES],
                        cwd=str(PROGRAMS), capture_output=True, stream_output=False,
                        env=worker_env(), nproc_per_node=2, timeout=200)
    assert result.ok, result.summary + "\n" + "\n".join(result.outputs[0][-30:])
    found = {case: [json.loads((out / f"{case}_{w}.json").read_text()) for w in (0, 1)]
             for case in CASES}
    found["out"] = out
    return found


def test_wrong_width_error_names_the_global_batch(records):
    """Issue 49 #7: the error named one worker's rows, (32, 19), not the user's (64, 19)."""
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError) as plain:
        model.fit(np.zeros((64, 19), "float32"), np.zeros((64, 1), "float32"), batch_size=64,
                  verbose=0)
    assert "(64, 19)" in str(plain.value)
    for worker, record in enumerate(records["wrong_width"]):
        assert record["error"] is not None, f"worker {worker} trained a wrong-width batch"
        assert "received input with shape (64, 19)" in record["error"], (worker, record)
        assert "(32, 19)" not in record["error"], (worker, record)


_PLAIN_SHUFFLE = ("import tensorflow as tf; "
                  "print([int(i) for i in tf.data.Dataset.range(64).shuffle(64, seed=1)])")


def test_seeded_tf_data_shuffle_keeps_plain_order(records):
    """Issue 49 #1: agreeing on Keras' seed reset TensorFlow's global seed, so a seeded shuffle
    ran in another order on every run. It runs in plain TensorFlow's order, which a fresh
    process gives (this one may have set TensorFlow's seed in an earlier test)."""
    plain = subprocess.run([sys.executable, "-c", _PLAIN_SHUFFLE], capture_output=True,
                           text=True, timeout=120, check=True, env=worker_env())
    want = json.loads(plain.stdout.strip().splitlines()[-1])
    got = records["seeded_shuffle"]
    for worker, record in enumerate(got):
        assert record["order"] == want, f"worker {worker}: the user's seeded shuffle changed"
        # numpy's and Python's global generators are where the program left them.
        assert record["after"] == record["before"], worker
    # ... and the workers still start from the same weights.
    for a, b in zip(got[0]["weights"], got[1]["weights"], strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert np.abs(np.asarray(got[0]["weights"][0])).sum() > 0


def test_unseeded_shuffle_is_worker_0s_order_on_every_worker(records, monkeypatch):
    """Without a Keras seed the order of fit(shuffle=True) comes from numpy, so each worker
    would draw its own; they train worker 0's order: what one process with its numpy state
    trains."""
    monkeypatch.setattr(seam, "keras_random_seed", lambda: None)  # as in a fresh program
    model = shuffle_model(sx.OneDeviceStrategy("cpu:0"))
    np.random.seed(100)  # worker 0's numpy state
    x, y = shuffle_data()
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=True, verbose=0)
    for worker, record in enumerate(records["unseeded_shuffled_fit"]):
        np.testing.assert_allclose(record["loss"], history.history["loss"], rtol=2e-5,
                                   atol=2e-5, err_msg=f"worker {worker}")
        for got, want in zip(record["weights"], model.get_weights(), strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5,
                                       err_msg=f"worker {worker}")


def test_tensorboard_logs_are_the_chiefs_and_checkpoints_too(records):
    """Issue 49 #6: both workers wrote event files into the one log directory. As in
    TensorFlow, a non-chief writes to ``<log_dir>/workertemp_<i>``, removed after fit."""
    root = records["out"] / "callbacks"
    logs = root / "logs"
    train_events = sorted(p.name for p in (logs / "train").glob("events.out.tfevents.*"))
    assert len(train_events) == 1, train_events  # the chief's alone
    assert not list(logs.rglob("workertemp_*")), sorted(map(str, logs.rglob("*")))
    assert [r["log_dir"] for r in records["tensorboard_and_checkpoint"]] == [str(logs)] * 2
    assert (root / "ckpt.weights.h5").exists()
    assert sorted(p.name for p in root.iterdir()) == ["ckpt.weights.h5", "logs"]
