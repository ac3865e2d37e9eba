"""Kill trials with real processes: a random worker SIGKILLed at a random moment, restarted.

One trial per mode runs by default; ``STRATAX_KILL_TRIALS=10 python -m pytest -m slow
tests/parameter_server/test_recovery.py`` runs the full count.
"""

import os
import random
import re
import time

import numpy as np
import pytest
from cluster_helpers import cluster  # noqa: F401 - `cluster` is a fixture

pytestmark = pytest.mark.timeout(900)


def _start(cluster, *args) -> None:  # noqa: F811 - fixture
    cluster.start("kill_trial.py", {"chief": 1, "worker": 2, "ps": 1}, args=args,
                  generic=("ps0",))
    deadline = time.monotonic() + 120
    while "STARTED" not in cluster.output("chief0"):
        assert time.monotonic() < deadline and cluster.procs["chief0"].poll() is None, \
            cluster.output("chief0")[-3000:]
        time.sleep(0.05)


def _kill_trial(cluster, mode: str, rng: random.Random) -> dict:  # noqa: F811 - fixture
    _start(cluster, mode)
    started = time.monotonic()
    victim = f"worker{rng.randrange(2)}"
    time.sleep(rng.uniform(0.0, 1.0))          # pulling, computing, pushing or between steps
    cluster.kill(victim)
    killed_after = time.monotonic() - started
    time.sleep(rng.uniform(0.0, 1.0))
    cluster.restart(victim)                     # same address: it rejoins and gets work again
    code, out = cluster.wait("chief0", timeout=180)
    assert code == 0, out[-4000:]
    result = cluster.result()
    # A kill after phase 1 would hit an idle worker, noticed only by phase 2's first call.
    assert killed_after < result["phase1_s"], ("phase 1 ended before the kill; raise "
                                               "kill_trial.PHASE1_MIN_S", killed_after, result)
    assert f"worker {victim[-1]}" in out and "re-queueing" in out, out[-3000:]

    # Exactly once: the optimizer counted one update per scheduled step, and the ps ledger
    # holds every step id of every scheduled call once (no gap, no repeat).
    assert result["iterations"] == [result["scheduled"]], result
    ledger = result["ledger"]
    assert len(ledger) == len(set(ledger)) == result["scheduled"]
    calls: dict[str, set[int]] = {}
    for step in ledger:
        call, index = re.fullmatch(r"(c\d+):(\d+)", step).groups()
        calls.setdefault(call, set()).add(int(index))
    assert all(indices == {0, 1, 2, 3} for indices in calls.values()), calls
    assert result["rejoined"] == 1
    assert result["steps_after_rejoin"][f"worker {victim[-1]}"] > 0, result
    if mode == "sync":                          # deterministic: equal to the run without a kill
        assert result["moved"] > 0.1 and result["max_abs_diff"] < 1e-5, result
    return result


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_trial(cluster, mode):  # noqa: F811 - fixture
    _kill_trial(cluster, mode, random.Random(f"{mode}-{time.time_ns()}"))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_trials(tmp_path, mode):
    from cluster_helpers import Cluster

    rng = random.Random(f"{mode}-{time.time_ns()}")
    for trial in range(int(os.environ.get("STRATAX_KILL_TRIALS", "10"))):
        group = Cluster(tmp_path / f"trial{trial}")
        group.log_dir.mkdir()
        try:
            _kill_trial(group, mode, rng)
        finally:
            group.kill_all()


@pytest.mark.slow
def test_sync_worker_not_restarted_fails_naming_it(cluster):  # noqa: F811 - fixture
    _start(cluster, "sync", "6")
    cluster.kill("worker1")
    code, out = cluster.wait("chief0", timeout=120)
    assert code == 0, out[-4000:]
    result = cluster.result()
    assert re.search(r"worker 1 at 127\.0\.0\.1:\d+ died and was not restarted within 6 s",
                     result["error"]), result
    assert result["after_s"] < 6 + 10, result      # the limit, plus the wait that noticed it


@pytest.mark.slow
def test_launch_restarts_a_dead_sync_worker_alone(tmp_path):
    import json
    import subprocess
    import sys

    from cluster_helpers import PROGRAMS

    marker = tmp_path / "killed"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STRATAX_") and k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
    proc = subprocess.run(
        [sys.executable, "-m", "stratax._src.cli", "launch", "--workers", "2", "--ps", "1",
         "--max-restarts", "1", "--timeout", "200", str(PROGRAMS / "kill_trial.py"), "sync"],
        env={**env, "KILL_ONCE_MARKER": str(marker)}, capture_output=True, text=True,
        timeout=230, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert marker.exists()
    assert re.search(r"worker 1 \(local rank 2, pid \d+\) failed with .*SIGKILL.*; restarting "
                     r"worker 1 alone \(task restart 1 of 1\)", out), out[-3000:]
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result["iterations"] == [result["scheduled"]] and result["rejoined"] == 1, result
    assert result["max_abs_diff"] < 1e-5, result


def test_killed_ps_restarts_from_its_snapshot_and_training_continues(cluster, tmp_path):  # noqa: F811
    every = 10
    # ps 0 is a generic `stratax server` (it starts in ~1 s; the program's import of JAX
    # takes several s on a loaded box, longer than the workers' 10 s of retries).
    cluster.start("snapshot_program.py", {"chief": 1, "worker": 2, "ps": 1}, generic=("ps0",),
                  env={"STRATAX_PS_SNAPSHOT_DIR": str(tmp_path / "snap"),
                       "STRATAX_PS_SNAPSHOT_EVERY": str(every)})
    deadline = time.monotonic() + 120
    while "STARTED" not in cluster.output("chief0"):
        assert time.monotonic() < deadline and cluster.procs["chief0"].poll() is None, \
            cluster.output("chief0")[-3000:]
        time.sleep(0.05)
    snapshot = tmp_path / "snap" / "ps0.npz"
    while not snapshot.exists():               # a restart before any snapshot restores nothing
        assert time.monotonic() < deadline and cluster.procs["chief0"].poll() is None, \
            cluster.output("chief0")[-3000:]
        time.sleep(0.05)
    rng = random.Random(time.time_ns())
    time.sleep(rng.uniform(0.05, 0.3))
    cluster.kill("ps0")
    # The kill must land mid-training (phase 1 lasts seconds; a quicker one needs more CALLS).
    assert "PHASE2" not in cluster.output("chief0"), "phase 1 ended before ps 0 was killed"
    cluster.restart("ps0")                     # same address, same snapshot directory
    while "PHASE2" not in cluster.output("chief0"):
        assert time.monotonic() < deadline + 60 and cluster.procs["chief0"].poll() is None, \
            cluster.output("chief0")[-3000:]
        time.sleep(0.05)
    cluster.kill("ps0")                        # for good: the error must name it
    code, out = cluster.wait("chief0", timeout=120)
    assert code == 0, out[-4000:]
    result = cluster.result()
    assert "restored 1 shard(s) from snapshot" in cluster.output("ps0"), cluster.output("ps0")
    iterations, ledger = result["iterations"][0], result["ledger"]
    lost = result["scheduled"] - iterations
    # Lost: the pushes applied after the last snapshot, at most `every`; none applied twice.
    assert 0 <= lost <= every, result
    assert len(ledger) == len(set(ledger)) == iterations, result
    assert re.search(r"ps 0 at 127\.0\.0\.1:\d+", result["error"] or ""), result
    assert result["error_s"] < 10 + 8, result   # timeout_seconds=10, plus one retried call
    print(f"phase1 {result['phase1_s']:.1f} s, lost {lost} of {result['scheduled']} steps, "
          f"stall {result['stall_s']:.1f} s, error after {result['error_s']:.1f} s")


def test_checkpoint_reshards_and_round_trips_through_mirrored(tmp_path):
    import json
    import subprocess
    import sys

    from cluster_helpers import PROGRAMS, Cluster

    def run_cluster(scenario, ps):
        group = Cluster(tmp_path / scenario)
        group.log_dir.mkdir()
        try:
            # Generic `stratax server` tasks start in ~1 s (no JAX import on the ps).
            group.start("checkpoint_program.py", {"chief": 1, "worker": 1, "ps": ps},
                        args=(scenario, str(tmp_path)),
                        generic=("worker0", *(f"ps{i}" for i in range(ps))))
            code, out = group.wait("chief0", timeout=180)
            assert code == 0, out[-4000:]
            return group.result()
        finally:
            group.kill_all()

    first = run_cluster("first", ps=2)
    assert first["shards"] == [2, 2, 2, 1] and first["ps"] == [0, 1]
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
    mirrored = subprocess.run([sys.executable, str(PROGRAMS / "checkpoint_program.py"), "mirrored",
                               str(tmp_path)], env=env, cwd=PROGRAMS, capture_output=True,
                              text=True, timeout=120)
    assert mirrored.returncode == 0, mirrored.stdout[-2000:] + mirrored.stderr[-3000:]
    loaded = json.loads(mirrored.stdout.split("RESULT ", 1)[1])
    assert loaded["loaded"] == ["sequential/dense/kernel", "sequential/dense/bias",
                                "sequential/dense_1/kernel", "sequential/dense_1/bias"]
    # Values and Adam state into Keras under MirroredStrategy: Keras' Adam training on from
    # there gives what the parameter servers gave.
    assert loaded["iterations"] == 8
    for a, b in zip(first["final"], loaded["trained"], strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    second = run_cluster("second", ps=1)
    assert second["shards"] == [3, 3, 3, 1] and second["ps"] == [0]   # 2 ps -> 1 ps, 3 shards
    for saved, keras_value, back in zip(first["saved"], loaded["weights"],
                                        second["from_mirrored"], strict=True):
        np.testing.assert_array_equal(keras_value, saved)                 # PSS -> Mirrored
        np.testing.assert_array_equal(back, 2 * np.asarray(saved))        # Mirrored -> PSS
    # Values and Adam state resharded: training on from the restore equals training on in
    # the first run (same batches, one worker).
    for a, b in zip(first["final"], second["final"], strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    # Adam's iterations come back with the slots: 8 steps before the checkpoint, 8 after.
    assert first["iterations"] == [[16, 16], [16, 16], [16, 16], [16]], first["iterations"]
    assert second["iterations"] == [[16, 16, 16]] * 3 + [[16]], second["iterations"]
