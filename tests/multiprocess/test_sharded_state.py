"""Checkpoints of arrays sharded over 2 real processes (``checkpoint.sharded_state``): each
process writes its own shards, a version is visible only once all are on disk, and it reads
back into another layout on 2 processes and whole or resharded on 1. The same run saves
variables a ``MultiWorkerMirroredStrategy(layout_map=...)`` holds in parts with
``sx.checkpoint.save_variables`` and loads them back into parts."""

import json

import pytest
from conftest import worker_cluster

pytestmark = pytest.mark.timeout(240)

_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}


def test_sharded_state_saved_on_two_processes_restores_on_two_and_one(workers, tmp_path):
    cluster = worker_cluster(2)
    configs = [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
               for i in range(2)]
    workers.start(["sharded_state_program.py", str(tmp_path), "save"], configs,
                  extra_env=_DEVICES)
    outputs = workers.wait(timeout=180)
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert "OK 10" in outputs[0] and "OK 9" in outputs[1], outputs[0][-2000:]
    assert "left by a writer that died: .staging-sharded-deadjob-0" in outputs[0]
    # Both processes' shards are in the committed version; nothing staged is left.
    files = sorted(p.name for p in (tmp_path / "ckpt-1").iterdir())
    assert "p0.json" in files and "p1.json" in files and "state.npz" in files, files
    workers.procs.clear()
    workers.start(["sharded_state_program.py", str(tmp_path), "restore"], ["{}"],
                  extra_env=_DEVICES)
    (output,) = workers.wait(timeout=120)
    assert workers.procs[0].returncode == 0, output[-3000:]
    assert "OK 5" in output, output[-2000:]
