"""Per-worker variables with real processes: chief + 2 workers + 1 ps on 127.0.0.1, worker 1
SIGKILLed and restarted between two phases (the chief is ``per_worker_variables_program.py``)."""

import json
import time

import pytest
from cluster_helpers import cluster, wait_all  # noqa: F401 - `cluster` is a fixture

pytestmark = pytest.mark.timeout(300)

CALLS, STEPS = 40, 2           # as in per_worker_variables_program.py
HIST0, STRIDE = [5, 5, 5], [1, 0, 2]


def _phase1(cluster, timeout=150.0):  # noqa: F811 - fixture
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in cluster.output("chief0").splitlines()
                 if line.startswith("PHASE1 ")]
        if lines:
            return json.loads(lines[0][len("PHASE1 "):])
        assert time.monotonic() < deadline and cluster.procs["chief0"].poll() is None, \
            cluster.output("chief0")[-3000:]
        time.sleep(0.1)


def _hist(steps):
    return [h + steps * s for h, s in zip(HIST0, STRIDE, strict=True)]


def test_each_worker_keeps_its_own_copy_and_a_restarted_one_starts_again(cluster, tmp_path):  # noqa: F811
    marker = tmp_path / "worker1-restarted"
    # ps 0 and worker 0 are generic `stratax server` tasks; worker 1 runs the chief's program.
    cluster.start("per_worker_variables_program.py", {"chief": 1, "worker": 2, "ps": 1},
                  args=(str(marker),), generic=("ps0", "worker0"))
    first = _phase1(cluster)

    # Each worker counted the steps it ran: the counts are the workers' shares of the steps.
    assert sum(first["steps"]) == CALLS * STEPS, first
    assert first["steps"] == first["worker_steps"], first
    assert first["consecutive"]           # a closure's two steps run on one worker, in order
    # A second per-worker variable, of another shape and dtype, counted the same steps.
    assert first["hist"] == [_hist(count) for count in first["steps"]], first
    assert first["created"]["steps"] == [[], "int32", False]
    assert first["created"]["hist"] == [[3], "int32"]
    # The parameter server holds the trained variable only.
    assert first["ps_shards"] == 1 and first["created"]["names"] == ["w"]
    assert first["w_iterations"] == CALLS * STEPS

    cluster.kill("worker1")
    cluster.restart("worker1")
    marker.touch()
    code, out = cluster.wait("chief0", timeout=180)
    assert code == 0, out[-4000:]
    result = cluster.result()
    assert result["rejoined"] == 1, result
    done = [after - before for after, before in zip(result["worker_steps"],
                                                    first["worker_steps"], strict=True)]
    assert sum(done) == result["calls"] * STEPS, result
    assert done[0] > 0 and done[1] > 0, result   # worker 0 ran while worker 1 was down
    # Worker 0 went on from its count; the restarted worker 1 started again from the initial
    # value (TensorFlow re-creates a recovered worker's variables), counting only its new steps.
    assert result["steps"] == [first["steps"][0] + done[0], done[1]], (first, result)
    assert result["hist"] == [_hist(result["steps"][0]), _hist(done[1])], result
    assert result["ps_shards"] == 1
    assert result["w_iterations"] == (CALLS + result["calls"]) * STEPS

    codes = wait_all(cluster, timeout=30)
    assert codes == {name: 0 for name in codes}
