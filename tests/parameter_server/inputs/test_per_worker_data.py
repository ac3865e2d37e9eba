"""Per-worker datasets and iterators against TensorFlow's own expectations
(``cluster_coordinator_test.py``, ``parameter_server_strategy_v2_test.py``): the guide's
``distribute_datasets_from_function`` inside the per-worker function, dataset objects, several
iterators in one function, iterators created while a worker is down, and iterators freed.
Real chief + 2 workers + 1 ps on 127.0.0.1 (``data_program.py``)."""

import time
from collections import Counter

import pytest
from cluster_helpers import cluster, wait_all  # noqa: F401 - `cluster` is a fixture

pytestmark = pytest.mark.timeout(300)


def _is_prefixes(steps, streams):
    """Whether ``steps`` are the first values 0, 1, ... of at most ``streams`` streams."""
    counts = Counter(steps)
    return all(counts[v] >= counts[v + 1] for v in range(max(steps))) and counts[0] <= streams


def test_guide_per_worker_data_api(cluster):  # noqa: F811 - fixture
    # Worker 0 is a generic `stratax server` (it loads the script by name); worker 1 runs this
    # program: in both, `strategy` inside per_worker_dataset_fn is bound on the worker.
    cluster.start("data_program.py", {"chief": 1, "worker": 2, "ps": 1}, args=("api",),
                  generic=("ps0", "worker0"))
    code, out = cluster.wait("chief0", timeout=240)
    assert code == 0, out[-4000:]
    result = cluster.result()

    # The guide: each worker's dataset_fn got its own pipeline id among 2; steps in order.
    assert result["guide_spec"] == [[[2], "float32"], [[1], "int32"]]
    assert result["guide_pipelines"] == [2]
    guide = result["guide"]
    assert set(guide) <= {"0", "1"} and sum(map(len, guide.values())) == 12
    assert all(steps == list(range(len(steps))) for steps in guide.values()), guide
    assert all(steps == list(range(len(steps)))
               for steps in result["from_function_on_chief"].values())
    assert "pass it to coordinator.create_per_worker_dataset" in result["iterated_on_chief"]

    # A tf.data.Dataset object, plain or through experimental_distribute_dataset: every worker
    # iterates its own copy from the start.
    for name in ("tf_dataset", "distributed"):
        assert result[f"{name}_spec"] == [[[2], "float32"], [[1], "int32"]]
        assert len(result[name]) == 10 and _is_prefixes(result[name], 2), result[name]

    # Two iterators in one function: a, b, a again, on the same worker, both advancing.
    rows = result["two"]
    assert len(rows) == 6
    per_worker = {}
    for a1, a1_step, b1, b1_step, a2, a2_step in rows:
        assert a1 // 1000 == b1 // 1000 == a2 // 1000, rows
        assert a2_step == a1_step + 1, rows
        per_worker.setdefault(a1 // 1000, []).append((a1_step, b1_step))
    for pairs in per_worker.values():
        pairs.sort()
        assert pairs == [(2 * i, i) for i in range(len(pairs))], rows

    for name in ("shuffled_fn", "shuffled_object"):  # TF's testDatasetsShuffledDifferently
        first, second = result[name]
        assert first != second and len(first) == 5, result[name]

    refusals = result["refusals"]
    assert refusals["number"].startswith("TypeError: create_per_worker_dataset takes"), refusals
    assert "runs Python" in refusals["generator"] and "def dataset_fn" in refusals["generator"]
    codes = wait_all(cluster, timeout=30)
    assert codes == {name: 0 for name in codes}


def test_iterators_are_freed_and_built_on_a_worker_that_was_down(cluster, tmp_path):  # noqa: F811
    cluster.start("data_program.py", {"chief": 1, "worker": 2, "ps": 1},
                  args=("lifecycle",), generic=("ps0", "worker0", "worker1"),
                  env={"HANDSHAKE_DIR": str(tmp_path)})

    def await_line(line):
        deadline = time.monotonic() + 180
        while line not in cluster.output("chief0"):
            assert time.monotonic() < deadline and cluster.procs["chief0"].poll() is None, \
                cluster.output("chief0")[-3000:]
            time.sleep(0.1)

    await_line("KILL worker1")
    cluster.kill("worker1")
    (tmp_path / "killed").touch()
    await_line("RESTART worker1")
    cluster.restart("worker1")
    (tmp_path / "restarted").touch()
    code, out = cluster.wait("chief0", timeout=180)
    assert code == 0, out[-4000:]
    result = cluster.result()

    # Item 8: 12 iterators held by each worker; after del + gc, only the 2 kept ones.
    assert result["held_before"] == [12, 12] and result["registry_before"] == 12
    assert result["released"], (result["registry_after"], result["held_after"])
    kept = result["registry_after"]
    assert len(kept) == 2 and result["held_after"] == [kept, kept]

    # Item 6: created while worker 1 was down (no error); worker 0 read it meanwhile.
    assert list(result["while_down"]) == ["0"] and result["while_down"]["0"] == list(range(6))
    assert "did not answer when a per-worker dataset was created" in out or \
        "it gets this dataset when it answers again" in out, out[-3000:]
    # Worker 1 restarted: it rebuilt the live iterators only, and reads the late one.
    assert result["rebuilt"] == result["live"] and len(result["live"]) == 3
    after = result["after_restart"]["1"]
    assert after == list(range(len(after))) and len(after) >= 3, result["after_restart"]
    codes = wait_all(cluster, timeout=30)
    assert codes == {name: 0 for name in codes}
