"""What a TensorFlow user trips on under MultiWorkerMirroredStrategy (issue 49), on 2 workers.

One launch of ``tf_user_program.py`` runs every case (the workers' start-up is the slow part);
each test reads its case's records and compares them with plain Keras in this process.
"""

import json
import sys

import keras
import numpy as np
import pytest
from conftest import HERE, worker_env

from stratax._src.launch import launch

pytestmark = pytest.mark.timeout(240)

CASES = ("wrong_width",)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """``{case: [worker 0's record, worker 1's record]}`` of one two-worker launch."""
    out = tmp_path_factory.mktemp("tf_user")
    result = launch([sys.executable, "tf_user_program.py", str(out), *CASES], cwd=str(HERE),
                    capture_output=True, stream_output=False, env=worker_env(),
                    nproc_per_node=2, timeout=200)
    assert result.ok, result.summary + "\n" + "\n".join(result.outputs[0][-30:])
    return {case: [json.loads((out / f"{case}_{w}.json").read_text()) for w in (0, 1)]
            for case in CASES}


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
