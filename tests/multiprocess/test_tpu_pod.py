"""``fit``/``evaluate``/``predict`` under a ``TPUStrategy`` spanning hosts, as pods are tested here:
2 processes x 2 emulated cores (``TPU_WORKER_HOSTNAMES`` + ``STRATAX_TPU_EMULATION``) equal
1 process x 4 cores and one device, a last partial batch included, and a fit stopped mid-epoch
and resumed by ``sx.BackupAndRestore`` equals the uninterrupted one."""

import subprocess
import sys

import numpy as np
import pytest
import tpu_pod_program as program
from conftest import PROGRAMS, free_ports, worker_env

import stratax as sx
from stratax._src.runtime import tpu_system

pytestmark = pytest.mark.timeout(300)
TOLERANCE = 2e-5
HOSTS, CORES = 2, 2
# Steps per epoch 7 in groups of 2: (0-1) (2-3) (4-5) (6). Stopped at epoch 1's second group,
# resumed from the backup after its first: the rest of the epoch is 3 groups.
GROUPS_AFTER_RESUME = 3


@pytest.fixture(autouse=True)
def _fresh_tpu_system():
    yield
    tpu_system.system.resolver = tpu_system.system.topology = None


def _start_pod(workers, tmp_path):
    """One process per host of an emulated 2-host pod slice, on 127.0.0.1."""
    (port,) = free_ports(1)
    for host in range(HOSTS):
        env = worker_env(TPU_WORKER_HOSTNAMES=",".join(["127.0.0.1"] * HOSTS),
                         TPU_WORKER_ID=str(host), STRATAX_TPU_EMULATION=str(CORES),
                         STRATAX_CPU_DEVICES=str(CORES), PYTHONUNBUFFERED="1")
        workers.procs.append(subprocess.Popen(
            [sys.executable, "tpu_pod_program.py", str(tmp_path), str(tmp_path / "backup"),
             f"127.0.0.1:{port}"], cwd=PROGRAMS, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True))


def _assert_equal(reference, candidate, what):
    for key, value in reference.items():
        if key.startswith(("resumed", "split", "plan")):
            continue
        assert np.shape(candidate[key]) == np.shape(value), (what, key)
        np.testing.assert_allclose(candidate[key], value, atol=TOLERANCE, err_msg=f"{what}: {key}")


def _assert_resumed_exactly(results, uninterrupted, what):
    assert int(results["resumed_groups"]) == GROUPS_AFTER_RESUME, what
    for i in range(sum(k.startswith("weight_") for k in uninterrupted)):
        np.testing.assert_allclose(results[f"resumed_{i}"], uninterrupted[f"weight_{i}"],
                                   atol=TOLERANCE, err_msg=f"{what}: resumed weight {i}")


def test_two_hosts_of_two_cores_equal_one_host_of_four_and_one_device(tmp_path, workers):
    _start_pod(workers, tmp_path)
    # Meanwhile, in this process: one device, and one host of 4 emulated cores.
    one_device = program.run(sx.OneDeviceStrategy("cpu:0"))
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=HOSTS * CORES)
    sx.tpu.experimental.initialize_tpu_system(resolver)
    one_host = program.run(sx.TPUStrategy(resolver), str(tmp_path / "one_host_backup"))
    outputs = workers.wait(timeout=240)
    for proc, output in zip(workers.procs, outputs, strict=True):
        assert proc.returncode == 0, output

    _assert_equal(one_device, one_host, "1 host x 4 cores")
    _assert_resumed_exactly(one_host, one_device, "1 host x 4 cores")
    for host in range(HOSTS):
        with np.load(tmp_path / f"host_{host}.npz") as data:
            pod = dict(data)
        assert (int(pod["hosts"]), int(pod["replicas"])) == (HOSTS, HOSTS * CORES)
        _assert_equal(one_device, pod, f"host {host} of 2 x 2 cores")
        _assert_resumed_exactly(pod, one_device, f"host {host} of 2 x 2 cores")
        assert str(pod["plan"]) == ("train/tpu-loop+group2 over 4 TPU replica(s) on 2 hosts, "
                                    "each feeding its share")
        assert str(pod["split_error"]) == (
            "Global batch size 14 does not split over 4 TPU replicas (2 hosts x 2); use a "
            "multiple of 4, e.g. `model.fit(..., batch_size=12)`.")
