"""A ``.keras`` resume and a checkpoint between a model built in code and the same model loaded
(chief + 1 worker + 1 ps, real processes)."""

import time

import pytest
from cluster_helpers import cluster, wait_all  # noqa: F401 - `cluster` is a fixture

pytestmark = pytest.mark.timeout(240)


def test_keras_resume_keeps_the_iterations_and_checkpoint_names_match(cluster):  # noqa: F811
    cluster.start("resume_program.py", {"chief": 1, "worker": 1, "ps": 1}, args=("resume",),
                  generic=("ps0",))
    code, out = cluster.wait("chief0", timeout=180)
    assert code == 0, out[-4000:]
    result = cluster.result()
    assert set(wait_all(cluster, timeout=30).values()) == {0}

    # The same layers, named with and without Keras' automatic model name.
    assert result["built_paths"][0].startswith("sequential") != \
        result["loaded_paths"][0].startswith("sequential"), result
    # Entries carry the path inside the model, whichever way it was made.
    assert result["entries"] == ["dense/kernel", "dense/bias", "dense_1/kernel",
                                 "dense_1/bias"], result
    # The file held 4 updates; evaluate placed the variables before fit, and the servers still
    # continued from 4 (the Adam state went with them), not from 0.
    assert result["loaded_iterations"] == 4, result
    assert result["resumed_iterations"] == 8 and result["ps_iterations"] == [8], result
    assert "restore_error" not in result, result["restore_error"]
    assert result["restore_err"] == 0.0, result
    # Shards that applied different numbers of updates: optimizer.iterations is the most, and
    # a warning names the shard behind with its count.
    assert result["uneven_shards"] == [[8], [12], [12], [12]], result
    assert result["uneven_iterations"] == 12, result
    assert ("optimizer.iterations = 12, the most updates a shard applied; 1 shard(s) applied "
            "fewer: 'dense/kernel' (ps 0): 8.") in out, out[-3000:]


def test_a_ps_restored_from_its_snapshot_is_reported_per_shard(cluster, tmp_path):  # noqa: F811
    """ps 1 restarted from its snapshot between two fits lost the updates after it: the model's
    optimizer.iterations counts the steps trained (ps 0's shards), and a warning names every
    shard of ps 1 with the updates it applied."""
    go = tmp_path / "go"
    cluster.start("resume_program.py", {"chief": 1, "worker": 1, "ps": 2},
                  args=("snapshot", str(go)), generic=("ps0", "ps1"),
                  env={"STRATAX_PS_SNAPSHOT_DIR": str(tmp_path / "snap"),
                       "STRATAX_PS_SNAPSHOT_EVERY": "5"})
    deadline = time.monotonic() + 150
    while "FIT1_DONE" not in cluster.output("chief0"):
        assert time.monotonic() < deadline and cluster.procs["chief0"].poll() is None, \
            cluster.output("chief0")[-3000:]
        time.sleep(0.05)
    cluster.kill("ps1")
    cluster.restart("ps1")
    go.touch()
    code, out = cluster.wait("chief0", timeout=150)
    assert code == 0, out[-4000:]
    result = cluster.result()
    assert "restored" in cluster.output("ps1"), cluster.output("ps1")[-2000:]
    counts = {ps: {n for v in result["shards"] for _, p, n in v if p == ps} for ps in (0, 1)}
    assert counts[0] == {16} and len(counts[1]) == 1 and max(counts[1]) < 16, result
    assert result["iterations"] == 16, result
    behind = [f"{key!r} (ps 1): {n}" for v in result["shards"] for key, p, n in v if p == 1]
    assert "optimizer.iterations = 16, the most updates a shard applied" in out, out[-3000:]
    assert all(shard in out for shard in behind), (behind, out[-3000:])
