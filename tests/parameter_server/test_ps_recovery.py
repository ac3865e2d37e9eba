"""Kill trials with real processes: a random worker SIGKILLed at a random moment, restarted.

One trial per mode runs by default; ``STRATAX_KILL_TRIALS=10 python -m pytest -m slow
tests/parameter_server/test_ps_recovery.py`` runs the full count.
"""

import os
import random
import re
import time

import pytest
from ps_cluster_helpers import cluster  # noqa: F401 - `cluster` is a fixture

pytestmark = pytest.mark.timeout(900)


def _kill_trial(cluster, mode: str, rng: random.Random) -> dict:  # noqa: F811 - fixture
    cluster.start("ps_kill_trial.py", {"chief": 1, "worker": 2, "ps": 1}, args=(mode,))
    deadline = time.monotonic() + 120
    while "STARTED" not in cluster.output("chief0"):
        assert time.monotonic() < deadline and cluster.procs["chief0"].poll() is None, \
            cluster.output("chief0")[-3000:]
        time.sleep(0.05)
    victim = f"worker{rng.randrange(2)}"
    time.sleep(rng.uniform(0.0, 1.0))          # pulling, computing, pushing or between steps
    cluster.kill(victim)
    time.sleep(rng.uniform(0.0, 1.0))
    cluster.restart(victim)                     # same address: it rejoins and gets work again
    code, out = cluster.wait("chief0", timeout=180)
    assert code == 0, out[-4000:]
    result = cluster.result()
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
    from ps_cluster_helpers import Cluster

    rng = random.Random(f"{mode}-{time.time_ns()}")
    for trial in range(int(os.environ.get("STRATAX_KILL_TRIALS", "10"))):
        group = Cluster(tmp_path / f"trial{trial}")
        group.log_dir.mkdir()
        try:
            _kill_trial(group, mode, rng)
        finally:
            group.kill_all()


def test_killed_ps_restarts_from_its_snapshot_and_training_continues(cluster, tmp_path):  # noqa: F811
    every = 10
    # ps 0 is a generic `stratax server` (it starts in ~1 s; the program's import of JAX
    # takes several s on a loaded box, longer than the workers' 10 s of retries).
    cluster.start("ps_snapshot.py", {"chief": 1, "worker": 2, "ps": 1}, generic=("ps0",),
                  env={"STRATAX_PS_SNAPSHOT_DIR": str(tmp_path / "snap"),
                       "STRATAX_PS_SNAPSHOT_EVERY": str(every)})
    deadline = time.monotonic() + 120
    while "STARTED" not in cluster.output("chief0"):
        assert time.monotonic() < deadline and cluster.procs["chief0"].poll() is None, \
            cluster.output("chief0")[-3000:]
        time.sleep(0.05)
    rng = random.Random(time.time_ns())
    time.sleep(rng.uniform(0.2, 1.0))
    cluster.kill("ps0")
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
