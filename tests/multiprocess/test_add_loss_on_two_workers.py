"""A layer's ``add_loss`` trains as on one device under 2 real processes (issue 40).

The loss is a sum over the rows of the batch (or nonlinear in it), so neither process's share
gives it: ``fit`` must run Keras' step over the global batch, not the packed step. History,
weights and evaluate are compared with one plain Keras process to 1e-5.
"""

import json

import numpy as np
import pytest
from add_loss_program import CASES, run
from conftest import worker_cluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def references():
    """Plain Keras in this process, before any test (its data path imports TensorFlow, which
    sets environment variables)."""
    return {name: run(name) for name in CASES}


@pytest.mark.slow  # tests/keras/test_add_loss.py checks the same losses in one process
def test_add_loss_fit_and_evaluate_equal_one_process(references, workers, tmp_path):
    cluster = worker_cluster(2)
    configs = [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
               for i in range(2)]
    workers.start(["add_loss_program.py", str(tmp_path)], configs)
    outputs = workers.wait(timeout=240)
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    for name in CASES:
        reference = references[name]
        for worker in range(2):
            with np.load(tmp_path / f"{name}_{worker}.npz") as got:
                assert sorted(got.files) == sorted(reference), name
                assert got["loss"].shape == (3,)
                for key in reference:
                    np.testing.assert_allclose(got[key], reference[key], rtol=1e-5, atol=1e-5,
                                               err_msg=f"{name} worker {worker} {key}")
