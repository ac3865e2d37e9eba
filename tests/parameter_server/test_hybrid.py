"""Hybrid mode (``ParameterServerStrategy(dense_variables="workers")``) on chief + 2 workers
+ 2 ps."""

import re
import time

import hybrid_program
import pytest
from cluster_helpers import Cluster, cluster, wait_all  # noqa: F401 - `cluster` is a fixture

import stratax as sx

pytestmark = pytest.mark.timeout(300)


def _run(cluster, scenario, kill=None):  # noqa: F811 - fixture
    """Runs ``scenario``; with ``kill``, SIGKILLs that task when the chief prints KILL_NOW and
    starts it again at its address a second later."""
    cluster.start("hybrid_program.py", {"chief": 1, "worker": 2, "ps": 2}, args=(scenario,),
                  generic=("ps0",))
    if kill:
        cluster.kill_on("KILL_NOW", kill)
        time.sleep(1.0)
        cluster.restart(kill)
    code, out = cluster.wait("chief0", timeout=240)
    assert code == 0, out[-4000:]
    result = cluster.result()
    assert set(wait_all(cluster, timeout=30).values()) == {0}
    return result, out


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """The ``all`` scenario's results: one cluster for the tests below."""
    group = Cluster(tmp_path_factory.mktemp("hybrid"))
    try:
        yield _run(group, "all")[0]
    finally:
        group.kill_all()


def test_sync_tables_equal_one_process_and_dense_updates_stay_on_the_workers(scenarios):
    result = scenarios["sync"]
    assert result["replicas"] == 2
    # One process on the same global batches, to float rounding; and exactly what mode="sync"
    # with every variable on the servers computes.
    assert result["weights_err"] < 5e-5 and result["history_err"] < 1e-5, result
    assert result["evaluate_err"] < 1e-5 and result["predict_err"] < 1e-5, result
    assert result["servers_err"] == 0.0, result
    assert result["iterations"] == 12, result                 # 6 global batches x 2 epochs
    assert result["optimizer_err"] < 1e-5, result             # Adam's moments came back
    assert result["resumed_err"] == 0.0, result             # resumed = uninterrupted, exactly
    # The dense kernel (2 shards) was updated 12 times, by the workers' replicas alone.
    assert result["dense_iterations"] == [12, 12] and result["dense_ledger"] == 0, result
    assert result["table_ledger"] == [12, 12], result         # the table's updates: on the ps
    assert all(steps > 0 for steps in result["worker_steps"].values()), result


def test_async_tables_apply_each_workers_rows_once_and_dense_stays_synchronous(scenarios):
    result = scenarios["async"]
    # Each worker's rows are an update of their own (two Adam steps where synchronous tables
    # take one), applied when they arrive: another rule than one process, which it does not
    # equal; it learns. Every update counts once: two per step on each table shard (both
    # workers' batches touch both halves of the vocabulary), one per step on the replicas.
    assert result["losses"][1] < result["losses"][0], result
    assert result["table_ledger"] == [24, 24], result
    assert result["iterations"] == 12, result
    assert result["dense_iterations"] == [12, 12] and result["dense_ledger"] == 0, result


def test_a_model_without_tables_is_refused(scenarios):
    error = scenarios["no_tables"]["error"]
    assert "reads no table by rows" in error and "MultiWorkerMirroredStrategy" in error, error


def test_a_killed_worker_restarts_and_the_run_equals_one_process(cluster):  # noqa: F811
    result, out = _run(cluster, "kill", kill="worker1")
    assert "re-queueing" in out, out[-3000:]
    assert result["rejoined"] == 1, result
    assert result["weights_err"] < 5e-5 and result["iterations"] == 96, result
    assert result["dense_iterations"] == [96, 96] and result["table_ledger"] == [96, 96], result


def test_a_worker_that_never_comes_back_fails_the_run_within_timeout_seconds(cluster):  # noqa: F811
    """docs/parameter_server.md, Failures: a hybrid-mode worker killed and not restarted fails
    the waiting steps with ``sx.WorkerUnavailableError`` naming it after ``timeout_seconds``;
    the run never hangs."""
    cluster.start("hybrid_program.py", {"chief": 1, "worker": 2, "ps": 1}, args=("gone",),
                  generic=("ps0",))
    cluster.kill_on("KILL_NOW", "worker1")
    killed_at = time.time()
    code, out = cluster.wait("chief0", timeout=120)
    assert code == 0, out[-4000:]
    result = cluster.result()
    assert re.search(r"worker 1 at 127\.0\.0\.1:\d+ died and was not restarted within 4 s",
                     result["error"] or ""), result
    # The limit, plus the heartbeat or call that noticed the death (loaded 2-core box).
    assert result["error_at"] - killed_at < hybrid_program.GONE_TIMEOUT_S + 10, result


@pytest.mark.parametrize("kwargs, message", [
    ({"dense_variables": "gpu"}, "dense_variables='gpu'"),
    ({"dense_variables": "workers", "mode": "sync", "max_staleness": 2}, "max_staleness=2"),
    ({"max_staleness": 1}, "needs dense_variables='workers'"),
    ({"dense_variables": "workers", "max_staleness": -1}, "max_staleness must be"),
])
def test_bad_hybrid_settings_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        sx.ParameterServerStrategy(**kwargs)
