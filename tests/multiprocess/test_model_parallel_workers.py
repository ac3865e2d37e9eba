"""Model parallelism across processes: ``MultiWorkerMirroredStrategy(cores_per_replica=...,
layout_map=...)`` on 2 workers x 2 CPU devices equals ``MirroredStrategy`` with the same
arguments on 4 devices of one process (one replica of 4 cores spanning both workers, and 2
replicas of 2 cores), and each worker holds only its parts of the split variables."""

import json

import keras
import numpy as np
import pytest
from conftest import worker_cluster
from model_parallel_program import layout_map, run

import stratax as sx

pytestmark = pytest.mark.timeout(240)


def test_model_parallel_across_workers_equals_one_process(workers, tmp_path):
    cluster = worker_cluster(2)
    configs = [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
               for i in range(2)]
    workers.start(["model_parallel_program.py", str(tmp_path)], configs,
                  extra_env={"STRATAX_CPU_DEVICES": "2"})
    # The references train here while the workers run.
    devices = [f"cpu:{i}" for i in range(4)]
    references = {}
    for cores in (4, 2):
        strategy = sx.MirroredStrategy(devices, cores_per_replica=cores, layout_map=layout_map())
        model, references[cores] = run(strategy)
        references[cores]["local"] = sum(  # every part of every variable, all in this process
            s.data.nbytes for v in [*model.variables, *model.optimizer.variables]
            for s in v.value.addressable_shards)
    outputs = workers.wait(timeout=200)
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for cores, mesh in ((4, {"replica": 1, "core": 4}), (2, {"replica": 2, "core": 2})):
        reference = references[cores]
        local = [int(o.split(f"cores {cores} mesh {mesh} local ")[1].split()[0]) for o in outputs]
        # Each worker holds half of the devices' parts (replicated values once per device).
        assert local[0] == local[1] == reference["local"] // 2, (local, reference["local"])
        with (np.load(tmp_path / f"cores{cores}_0.npz") as w0,
              np.load(tmp_path / f"cores{cores}_1.npz") as w1):
            assert sorted(w0.files) == sorted(k for k in reference if k != "local")
            for key in w0.files:
                np.testing.assert_array_equal(w0[key], w1[key], err_msg=f"{cores} {key}")
                np.testing.assert_allclose(w0[key], reference[key], rtol=1e-5, atol=1e-6,
                                           err_msg=f"{cores} {key}")
            saved = keras.saving.load_model(tmp_path / f"cores{cores}_0.keras")
            for i, weight in enumerate(saved.get_weights()):
                np.testing.assert_array_equal(weight, w0[f"w{i}"])
    for output in outputs:
        assert output.count("refused model.get_weights() would gather") == 2, output[-2000:]
        assert "Save the state in parts instead" in output
