"""fit's optimizer update sharded over 2 real processes (``keras.steps.sharded_update``).

Each process updates its part of every variable between a reduce-scatter and an all-gather
over shared memory; training must equal one process, the workers must hold the same bits, and
an optimizer that reads more than one element (norm clipping) keeps the replicated update.
"""

import json
import os

import numpy as np
import pytest
from conftest import worker_cluster
from sharded_update_program import OPTIMIZERS, make, train

import stratax as sx
from stratax._src.runtime import shm_build

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shm"),
              pytest.mark.skipif(shm_build.compiler() is None,
                                 reason="no C++ compiler: shm falls back to gloo")]


def test_sharded_update_trains_as_one_process(workers, tmp_path, monkeypatch):
    cluster = worker_cluster(2)
    configs = [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
               for i in range(2)]
    workers.start(["sharded_update_program.py", str(tmp_path)], configs,
                  extra_env={"STRATAX_CPU_COLLECTIVES": "shm"})
    outputs = workers.wait(timeout=240)
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    for name in OPTIMIZERS:
        expected = 0 if name == "clipnorm" else 1
        for output in outputs:
            # One group program traced per fit: its one reduce-scatter call site.
            assert f"{name} scatters {expected}" in output, output[-2000:]
            plan = "train/packed+group4+rows" + ("+sharded-update" if expected else "")
            assert f"{name} plan {plan}\n" in output, output[-2000:]  # docs/design/step-plan.md
        with sx.OneDeviceStrategy("cpu:0").scope():
            reference = train(make(name))
        with np.load(tmp_path / f"{name}_0.npz") as w0, np.load(tmp_path / f"{name}_1.npz") as w1:
            assert sorted(w0.files) == sorted(reference), name
            for key in reference:
                np.testing.assert_array_equal(w0[key], w1[key], err_msg=f"{name} {key}")
                np.testing.assert_allclose(w0[key], reference[key], rtol=2e-5, atol=2e-6,
                                           err_msg=f"{name} {key}")
