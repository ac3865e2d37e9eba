"""``fit``/``evaluate``/``predict`` under a ``TPUStrategy`` spanning hosts, as pods are tested here:
2 processes x 4 emulated cores (``STRATAX_TPU_EMULATION`` under ``stratax launch``) in replicas
of 2 logical cores, a ``LayoutMap`` splitting a small CNN's hidden kernel over the hosts (held in
parts) and its convolution and head over the cores. Host 1 is SIGKILLed mid-epoch, the launcher
relaunches the pod, and ``sx.BackupAndRestore`` resumes it; 1 process x 8 cores is stopped and
resumed the same way (by an error). Both end at the weights of one device's uninterrupted fit,
with its ``validation_data`` metrics (at a batch size of their own), ``evaluate`` results and
predictions (last partial batches of each kind included), and the pod's resumed epoch logs the
train metrics of one host's."""

import os
import sys
import threading

import numpy as np
import pytest
import tpu_pod_program as program
from conftest import PROGRAMS, ROOT

import stratax as sx
from stratax._src.launch import launch
from stratax._src.runtime import tpu_system

pytestmark = pytest.mark.timeout(300)
TOLERANCE = 2e-5
HOSTS, CORES = 2, 4
REPLICAS = HOSTS * CORES // program.CORES_PER_REPLICA
# Steps per epoch 7 in groups of 2: (0-1) (2-3) (4-5) (6). Stopped at epoch 1's second group,
# resumed from the backup after its first: the rest of the epoch is 3 groups.
GROUPS_AFTER_RESUME = 3


@pytest.fixture(autouse=True)
def _fresh_tpu_system():
    yield
    tpu_system.system.resolver = tpu_system.system.topology = None


def _launch_pod(tmp_path, results):
    """One process per host of an emulated 2-host pod slice on 127.0.0.1, started by the
    launcher, which restarts the pod once after host 1's SIGKILL; the ``LaunchResult`` goes
    to ``results``."""
    env = {"STRATAX_TPU_EMULATION": str(CORES), "STRATAX_CPU_DEVICES": str(CORES),
           # This process's split into 8 devices; the hosts' own comes from the line above.
           "XLA_FLAGS": "", "PYTHONPATH": os.pathsep.join(
               [str(PROGRAMS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    results.append(launch(
        [sys.executable, "tpu_pod_program.py", str(tmp_path), str(tmp_path / "backup")],
        nproc_per_node=HOSTS, max_restarts=1, timeout=240, grace_period=1.0, cwd=str(PROGRAMS),
        env=env, capture_output=True, stream_output=False))


def _assert_equal(reference, candidate, what, resumed=False):
    """``candidate`` equals ``reference`` (uninterrupted, on one device) on every result; a
    ``resumed`` candidate's history is the resumed epoch's, whose validation metrics equal the
    reference's last epoch's (its train metrics cover only the steps after the resume)."""
    for key, value in reference.items():
        if key.startswith(("groups", "split", "plan")):
            continue
        if resumed and key.startswith("history_"):
            if not key.startswith("history_val_"):
                continue
            value = value[-1:]
        assert np.shape(candidate[key]) == np.shape(value), (what, key)
        np.testing.assert_allclose(candidate[key], value, atol=TOLERANCE, err_msg=f"{what}: {key}")


def test_two_hosts_of_four_cores_equal_one_host_of_eight_and_one_device(tmp_path):
    launched = []
    pod = threading.Thread(target=_launch_pod, args=(tmp_path, launched))
    pod.start()
    try:
        # Meanwhile, in this process: one device, uninterrupted; one host of 8 emulated cores,
        # stopped mid-epoch by an error and resumed from its backup.
        one_device = program.run(sx.OneDeviceStrategy("cpu:0"))
        resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=HOSTS * CORES)
        strategy, backup = program.tpu_strategy(resolver), str(tmp_path / "one_host_backup")
        program.interrupt(strategy, backup)
        one_host = program.run(strategy, backup)
    finally:
        pod.join(timeout=280)
    (result,) = launched
    assert result.ok, result.summary + "\n" + "\n".join(result.outputs[0][-30:])

    assert {"history_val_loss", "history_val_w_xent"} <= one_device.keys()
    assert int(one_device["groups"]) == 2 * 4 and not one_host["split_hidden_kernel"]
    _assert_equal(one_device, one_host, "1 host x 8 cores, resumed", resumed=True)
    assert int(one_host["groups"]) == GROUPS_AFTER_RESUME
    # The pod: host 1 SIGKILLed mid-epoch, the launcher restarted both hosts once.
    assert result.restarts == 1
    (killed,) = result.failures
    assert (killed.signal_name, killed.local_rank) == ("SIGKILL", 1)
    for host in range(HOSTS):
        with np.load(tmp_path / f"host_{host}.npz") as data:
            pod = dict(data)
        what = f"host {host} of 2 x 4 cores, relaunched"
        assert (int(pod["hosts"]), int(pod["replicas"])) == (HOSTS, REPLICAS)
        assert pod["split_hidden_kernel"]   # each host holds its part only
        assert int(pod["groups"]) == GROUPS_AFTER_RESUME, what
        _assert_equal(one_device, pod, what, resumed=True)
        # The resumed epoch's train metrics (a padded last batch included) equal one host's.
        for key in one_host:
            if key.startswith("history_"):
                np.testing.assert_allclose(pod[key], one_host[key], atol=TOLERANCE,
                                           err_msg=f"{what}: {key}")
        assert str(pod["plan"]) == (f"train/tpu-loop+group2 over {REPLICAS} TPU replica(s) on "
                                    "2 hosts, each feeding its share")
        assert str(pod["split_error"]) == (
            f"Global batch size 14 does not split over {REPLICAS} TPU replicas (2 hosts x 2); "
            f"use a multiple of {REPLICAS}, e.g. `model.fit(..., batch_size=12)`.")
