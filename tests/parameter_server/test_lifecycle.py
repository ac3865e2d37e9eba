"""The cluster's lifecycle with real processes: a chief killed, restarted or doubled, a worker
stopped or lost, a ps lost; every wait is bounded by a timeout the user sets."""

import os
import re
import signal
import socket
import time

import pytest
from cluster_helpers import cluster  # noqa: F401 - `cluster` is a fixture

pytestmark = pytest.mark.timeout(180)
CHIEF_TIMEOUT = 3.0
SERVED = ("worker0", "worker1", "ps0")


def _started(cluster, name="chief0", timeout=120.0):  # noqa: F811 - fixture
    deadline = time.monotonic() + timeout
    while "STARTED" not in cluster.output(name):
        assert time.monotonic() < deadline and cluster.procs[name].poll() is None, \
            cluster.output(name)[-3000:]
        time.sleep(0.05)


def _start(cluster, *args, chief_timeout=60.0):  # noqa: F811 - fixture
    """Starts ``lifecycle_program.py`` (chief + 2 workers + 1 ps, ``stratax server`` tasks) with
    ``args`` and waits for STARTED; returns the cluster spec."""
    spec = cluster.start("lifecycle_program.py", {"chief": 1, "worker": 2, "ps": 1}, args=args,
                         generic=SERVED,
                         env={"STRATAX_PS_CHIEF_TIMEOUT_SECONDS": str(chief_timeout)})
    _started(cluster)
    return spec


def _result(cluster):  # noqa: F811 - fixture
    """The chief's RESULT once it exited with status 0."""
    code, out = cluster.wait("chief0", timeout=120)
    assert code == 0, out[-3000:]
    return cluster.result()


def _exits(cluster, names, timeout):  # noqa: F811 - fixture
    """Waits for the tasks ``names``; returns their exit codes and the seconds it took."""
    start = time.monotonic()
    codes = {name: cluster.procs[name].wait(timeout=timeout) for name in names}
    return codes, time.monotonic() - start


def _port_free(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as s:
        # As a server binds (gRPC sets SO_REUSEADDR): closed connections in TIME_WAIT on the
        # port do not count, a listening socket does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
            s.listen()
        except OSError:
            return False
    return True


def test_served_tasks_exit_when_the_chief_is_killed(cluster):  # noqa: F811 - fixture
    spec = _start(cluster, "60", "10", chief_timeout=CHIEF_TIMEOUT)
    cluster.kill("chief0")
    codes, seconds = _exits(cluster, SERVED, timeout=60)
    assert codes == {name: 1 for name in SERVED}, codes
    assert seconds < CHIEF_TIMEOUT + 3, seconds
    assert "no chief heard" in cluster.output("ps0")
    assert all(_port_free(a) for a in [*spec["worker"], *spec["ps"]])


def test_served_tasks_exit_when_no_chief_ever_comes(cluster):  # noqa: F811 - fixture
    # A chief that failed at start-up (a port in use, a bad script) never calls the tasks.
    cluster.start("lifecycle_program.py", {"chief": 1, "worker": 1, "ps": 1}, skip=("chief0",),
                  generic=("worker0", "ps0"),
                  env={"STRATAX_PS_CHIEF_TIMEOUT_SECONDS": str(CHIEF_TIMEOUT)})
    codes, seconds = _exits(cluster, ("worker0", "ps0"), timeout=60)
    assert codes == {"worker0": 1, "ps0": 1}, codes
    assert seconds < CHIEF_TIMEOUT + 10, seconds  # with the servers' start-up


def test_second_chief_is_refused_and_a_restarted_chief_starts_afresh(cluster):  # noqa: F811
    _start(cluster, "60", "10")
    # Two chiefs at once: the second waits its timeout_seconds (2 s), then fails naming why.
    cluster.restart("chief0", args=("1", "2"), as_name="chief0b")
    code = cluster.procs["chief0b"].wait(timeout=60)
    assert code != 0 and "owned by another chief" in cluster.output("chief0b"), \
        cluster.output("chief0b")[-3000:]
    assert cluster.procs["chief0"].poll() is None  # the first one trains on

    # The first chief killed mid-training, a new one with the same TF_CONFIG: it takes the
    # tasks over, they drop the old session's state, and it trains exactly its own steps.
    cluster.kill("chief0")
    cluster.restart("chief0", args=("1", "10"))
    result = _result(cluster)
    assert result["iterations"] == result["applied"] == result["ledger"] == result["scheduled"]
    assert result["duplicates"] == 0, result
    assert "takes over" in cluster.output("ps0")
    codes, _ = _exits(cluster, SERVED, timeout=30)
    assert codes == {name: 0 for name in SERVED}, codes


def test_a_stopped_worker_holds_asynchronous_training_for_timeout_seconds_only(cluster):  # noqa: F811
    """docs/parameter_server.md, Failures: a hung worker's closure re-runs on another after
    ``timeout_seconds``, each step applied once, and the worker is taken back."""
    # timeout_seconds=2: worker 1 SIGSTOPped for 8 s; its closure moves to worker 0 after ~2 s.
    _start(cluster, "10", "2")
    time.sleep(0.5)
    os.killpg(cluster.procs["worker1"].pid, signal.SIGSTOP)
    try:
        time.sleep(8)
    finally:
        os.killpg(cluster.procs["worker1"].pid, signal.SIGCONT)
    result = _result(cluster)
    assert result["longest_round_s"] < 5, result       # not the 8 s the worker was stopped
    assert result["iterations"] == result["ledger"] == result["scheduled"], result
    assert result["stats"]["worker 1"]["rejoined"] == 1, result


def test_a_lost_ps_fails_join_within_the_chiefs_timeout(cluster):  # noqa: F811 - fixture
    # The workers are `stratax server` tasks (their own default: 60 s); the chief's
    # timeout_seconds=3 bounds their calls to the ps too.
    _start(cluster, "30", "3")
    killed_at = time.time()
    cluster.kill("ps0")
    result = _result(cluster)
    assert "ps 0 at 127.0.0.1:" in result["error"], result
    assert result["error_at"] - killed_at < 3 + 5, result   # not the workers' 60 s


@pytest.mark.slow  # ~25 s: the chief waits for a worker's restart
def test_a_restarted_worker_is_noticed_by_the_heartbeat(cluster):  # noqa: F811 - fixture
    # Killed and restarted while the chief sleeps (no call to it): the heartbeat notices.
    _start(cluster, "3", "10", "8")
    cluster.kill("worker1")
    cluster.restart("worker1")
    deadline = time.monotonic() + 8
    noticed = r"worker 1 at 127\.0\.0\.1:\d+ was restarted \(new process\)"
    while not re.search(noticed, cluster.output("chief0")):
        assert time.monotonic() < deadline, cluster.output("chief0")[-3000:]
        time.sleep(0.1)
    assert "re-queueing" not in cluster.output("chief0")   # before any closure tried it
    result = _result(cluster)
    assert result["iterations"] == result["ledger"] == result["scheduled"], result
    assert result["stats"]["worker 1"]["rejoined"] == 1, result


def test_losing_both_workers_waits_for_their_return(cluster):  # noqa: F811 - fixture
    # TensorFlow's coordinator waits for lost workers; so does ours, up to timeout_seconds.
    _start(cluster, "3", "30")
    cluster.kill("worker0")
    cluster.kill("worker1")
    time.sleep(1)
    cluster.restart("worker0")
    cluster.restart("worker1")
    result = _result(cluster)
    assert "error" not in result, result
    assert result["iterations"] == result["ledger"] == result["scheduled"], result
    # Both are taken back (a worker idle at the kill is noticed by the heartbeat; it counts as
    # rejoined once a closure reaches it).
    assert sum(s.get("rejoined", 0) for s in result["stats"].values()) >= 1, result


def test_losing_both_workers_for_good_fails_after_timeout_seconds(cluster):  # noqa: F811
    _start(cluster, "30", "3")
    killed_at = time.time()
    cluster.kill("worker0")
    cluster.kill("worker1")
    result = _result(cluster)
    assert re.search(r"No worker is left: none came back within 3 s .*worker 0 at 127\.0\.0\.1:"
                     r"\d+, worker 1 at", result["error"]), result
    assert 3 <= result["error_at"] - killed_at < 3 + 4, result
