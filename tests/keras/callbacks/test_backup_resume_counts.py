"""A backup resumes into another number of replicas: written by 1, 2 or 3, resumed by each of
the others, it ends at the weights of the uninterrupted run (float rounding: the gradient sum
has another order). The same holds across processes: ``tests/multiprocess/test_elastic_launch``
drops a worker and resumes on the one left."""

import itertools

import numpy as np
import pytest
from test_backup import _data, _FailAt, _model, _raise

import stratax as sx
from stratax._src.keras.callbacks.backup import wait_for_writes


def _strategy(replicas):
    return sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)])


@pytest.fixture(scope="module")
def uninterrupted():
    x, y = _data()
    model = _model(_strategy(1))
    model.fit(x, y, batch_size=24, epochs=2, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize("writer, reader",
                         [p for p in itertools.product((1, 2, 3), repeat=2) if p[0] != p[1]])
def test_a_backup_resumes_into_another_replica_count(tmp_path, uninterrupted, writer, reader):
    x, y = _data()                                   # 5 steps of 24 per epoch, 10 in all
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="simulated crash"):
        _model(_strategy(writer)).fit(
            x, y, batch_size=24, epochs=2, verbose=0,
            callbacks=[sx.BackupAndRestore(backup, save_freq=3), _FailAt(7, _raise)])
    wait_for_writes(backup)
    resumed = _model(_strategy(reader))
    ran = _FailAt(0, _raise)                         # counts the steps; never fires
    resumed.fit(x, y, batch_size=24, epochs=2, verbose=0,
                callbacks=[sx.BackupAndRestore(backup, save_freq=3), ran])
    assert ran.seen == 4, ran.seen                   # from the backup of step 6, not from 0
    assert int(resumed.optimizer.iterations.numpy()) == 10
    for got, want in zip(resumed.get_weights(), uninterrupted, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_batch_that_does_not_split_over_the_new_count_is_a_clear_error(tmp_path):
    """Written by 2 replicas with a global batch of 16, resumed by 3: the resumed fit stops at
    once, naming the batch and the replica count, before it trains a step."""
    x, y = _data()
    backup = str(tmp_path / "backup")
    with pytest.raises(RuntimeError, match="simulated crash"):
        _model(_strategy(2)).fit(
            x, y, batch_size=16, epochs=1, verbose=0,
            callbacks=[sx.BackupAndRestore(backup, save_freq=3), _FailAt(4, _raise)])
    wait_for_writes(backup)
    with pytest.raises(ValueError, match="Global batch size 16 does not split over 3 replicas"):
        _model(_strategy(3)).fit(x, y, batch_size=16, epochs=1, verbose=0,
                                 callbacks=[sx.BackupAndRestore(backup, save_freq=3)])
