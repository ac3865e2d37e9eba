"""Failures through `stratax launch` end fast and name the right worker (issue 8, items 5-7).

Real MultiWorkerMirroredStrategy workers on 127.0.0.1; every test measures the seconds from
the fault to the end of the whole group. Before the fixes: an exception on worker 1 ended the
group after JAX's shutdown barrier timed out (60 s here, 127 s with the default timeout) with
worker 1's SIGABRT and absl noise quoted; SIGTERM to a worker was swallowed by JAX's preemption
notifier; `python -m stratax` did not exist.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import PROGRAMS, ROOT, worker_env

from stratax._src.launch import launch

pytestmark = pytest.mark.timeout(180)
FAULT_PROGRAM = "mwms_fault_program.py"
# Seconds from the fault to the end of the group: 0.4 s measured on an idle box
# (docs/failures-and-signals.md); 10 s leaves a loaded 2-core box headroom and is still far
# below the 60 s shutdown barrier the program would wait without the fix.
ENDS_WITHIN = 10.0


@pytest.fixture(autouse=True)
def _no_inherited_cluster(monkeypatch):
    for name in ("STRATAX_CPU_DEVICES", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _launch_fault(tmp_path, mode, **env):
    result = launch([sys.executable, FAULT_PROGRAM, str(tmp_path), mode], nproc_per_node=2,
                    cwd=str(PROGRAMS), capture_output=True, stream_output=False, timeout=150,
                    env={"PYTHONPATH": os.pathsep.join([str(PROGRAMS), str(ROOT)]), **env})
    ended = time.time()
    event = tmp_path / "event.time"
    assert event.exists(), result.summary
    return result, ended - float(event.read_text())


@pytest.mark.parametrize("mode, message", [
    ("raise_at_batch", "RuntimeError: worker one failed at batch 20"),
    ("raise_after_strategy", "RuntimeError: worker one failed right after creating the strategy"),
])
def test_exception_on_one_worker_ends_the_group_and_names_it(tmp_path, mode, message):
    result, seconds = _launch_fault(tmp_path, mode)
    print(f"{mode}: {seconds:.2f} s from the raise to the end of the group")
    assert seconds < ENDS_WITHIN, result.summary
    failure = result.failure
    assert failure is not None and failure.name == "worker 1", result.summary
    assert (failure.exit_code, result.exit_code) == (1, 1)
    first_line, *quoted = result.summary.splitlines()
    assert "worker 1" in first_line and "exit code 1" in first_line
    assert "worker 1's last Python traceback:" in quoted[0]
    assert quoted[1].endswith("Traceback (most recent call last):")
    assert any(line.endswith(message) for line in quoted), result.summary
    assert "SIGABRT" not in result.summary and "Check failure" not in result.summary
    # The worker said why it skipped the barrier; its peer never got to finish training.
    assert any("without waiting for the other workers" in line for line in result.outputs[1])
    assert not any("training ended normally" in line for line in result.outputs[0])


def test_sigterm_ends_a_worker_without_backup_and_restore(tmp_path):
    result, seconds = _launch_fault(tmp_path, "sigterm")
    print(f"sigterm: {seconds:.2f} s from the SIGTERM to the end of the group")
    assert seconds < ENDS_WITHIN, result.summary
    failure = result.failure
    assert failure is not None and failure.name == "worker 1", result.summary
    assert failure.signal_name == "SIGTERM" and result.exit_code == 128 + signal.SIGTERM
    assert not any("SIGTERM caught" in line for line in result.outputs[1])


@pytest.mark.parametrize("collectives", ["auto", pytest.param("gloo", marks=pytest.mark.slow)])
def test_a_frozen_worker_is_named_and_the_group_ends(tmp_path, collectives):
    """Worker 1 SIGSTOPs itself at batch 20 (timeout_seconds=10). On one host (shared memory)
    worker 0's all-reduce times out with WorkerUnavailableError naming worker 1; over gloo,
    JAX's heartbeat check (twice the timeout) aborts worker 0 and lists process 1. Either way
    the launcher names worker 1, not the healthy worker that reported it."""
    result, seconds = _launch_fault(tmp_path, "sigstop", STRATAX_CPU_COLLECTIVES=collectives)
    print(f"sigstop ({collectives}): {seconds:.2f} s from the freeze to the end of the group")
    assert seconds < (10 if collectives == "auto" else 20) + ENDS_WITHIN, result.summary
    failure = result.failure
    assert failure is not None and failure.name == "worker 1", result.summary
    assert failure.reported_by == "worker 0" and "stopped answering" in result.summary
    evidence = ("WorkerUnavailableError: The shared-memory all-reduce failed: worker 1"
                if collectives == "auto" else "(stopped sending heartbeats): 1")
    assert evidence in result.summary and "Check failure" not in result.summary


def test_sigterm_to_stratax_launch_ends_the_workers_without_sigkill(tmp_path):
    """The launcher forwards SIGTERM; the workers end on it (the 60 s grace period before
    SIGKILL is never needed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stratax", "launch", "--nproc-per-node", "2", "--grace-period",
         "60", "--timeout", "150", FAULT_PROGRAM, str(tmp_path), "none"],
        cwd=PROGRAMS, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"training_{i}").exists() for i in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    print(f"launcher SIGTERM: {seconds:.2f} s to the end of the group")
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "interrupted by SIGTERM" in stderr
    assert seconds < ENDS_WITHIN, stderr[-3000:]


def test_python_dash_m_stratax_runs_as_a_launched_worker(tmp_path):
    """`stratax launch -m stratax ...` (item 5): each worker runs `python -m stratax`."""
    done = subprocess.run(
        [sys.executable, "-m", "stratax", "launch", "--nproc-per-node", "2", "--timeout", "60",
         "-m", "stratax", "--version"],
        cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    for worker in (0, 1):
        assert f"[worker {worker}] stratax " in done.stdout, done.stdout


@pytest.mark.slow
def test_stratax_launch_dash_m_stratax_train(tmp_path):
    """The command of issue 8, item 5: two workers train the digits with MWMS."""
    done = subprocess.run(
        [sys.executable, "-m", "stratax", "launch", "--nproc-per-node", "2", "--timeout", "150",
         "-m", "stratax", "train", "--strategy", "multi_worker_mirrored", "--epochs", "1",
         "--verbose", "0"],
        cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    for worker in (0, 1):
        assert f"[worker {worker}] stratax train: done: test accuracy" in done.stdout
    assert "2 replicas | multi_worker_mirrored" in done.stdout
