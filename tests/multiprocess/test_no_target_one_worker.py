"""Issue 49 #8: ``evaluate`` after fit (2 steps) and predict (1) of a model whose only loss is a
layer's ``add_loss``, under a launched one-worker MultiWorkerMirroredStrategy and
OneDeviceStrategy, against plain Keras on the same data and initial weights.

The issue's 18.599 against plain Keras' 18.582 (both strategies alike) is fit's default
``shuffle=True``: stratax orders an epoch by ``(seed, epoch)``, plain Keras by numpy's global
generator (docs/fit.md). Unshuffled, every result equals plain Keras'; shuffled, plain Keras fed
the rows in stratax's order gives stratax's results.
"""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(120)

_ONE_WORKER = json.dumps({"cluster": {"worker": ["127.0.0.1:1"]},
                          "task": {"type": "worker", "index": 0}})


def _close(got, want):
    for key in ("loss", "predict", "evaluate"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-6, err_msg=key)


def test_no_target_sequence_equals_plain_keras_on_one_worker(workers):
    workers.start(["no_target_program.py"], [_ONE_WORKER])
    (out,) = workers.wait(timeout=100)
    assert workers.procs[0].returncode == 0, out[-3000:]
    results = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert results["workers"] == 1
    for strategy in ("mwms", "one_device"):
        _close(results[f"{strategy}_False"], results["plain_False"])
        _close(results[f"{strategy}_True"], results["plain_in_stratax_order"])
    # The issue's symptom, explained: plain Keras' own shuffle visits the rows in another order.
    assert abs(results["mwms_True"]["evaluate"] - results["plain_True"]["evaluate"]) > 1e-4
    assert results["plain_False"]["evaluate"] > 1  # the added sum is what evaluate reports
