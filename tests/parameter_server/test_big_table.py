"""The big-table demo (``benchmarks/workloads/ps_big_table.py``) at a small size: workers under a
hard memory cap train a partitioned table row-sparse; the full 4M x 64 run is the documented
command."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _demo(tmp_path, *args):
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.workloads.ps_big_table",
                           "--out", str(out),
                           "--timeout", "150", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(240)
def test_capped_workers_train_a_partitioned_table(tmp_path):
    """The custom loop's row-sparse path: workers under a 512 MiB cap train a table
    partitioned over two ps (the Keras test below caps them under a 1 GiB table)."""
    result = _demo(tmp_path, "--rows", "200000", "--steps", "40", "--worker-mib", "512")
    assert "error" not in result, result
    assert result["exit_codes"] == {"chief0": 0, "worker0": 0, "worker1": 0, "ps0": 0, "ps1": 0}
    assert result["iterations"] == [44, 44]               # 4 warm-up + 40 steps on both shards
    assert result["loss_last20"] < 0.8 * result["loss_first20"], result
    peaks = result["peak_rss_mib"]
    assert 0 < peaks["worker0"] < 512 and 0 < peaks["worker1"] < 512, peaks


@pytest.mark.timeout(240)
def test_keras_fit_of_a_table_larger_than_the_capped_chief(tmp_path):
    """A 1,074 MiB Keras Embedding built by its 2 ps; every process but the ps capped, the
    chief at 640 MiB (0.6x the table): fit and evaluate run, get_weights is refused."""
    result = _demo(tmp_path, "--keras", "--rows", "4400000", "--steps", "8", "--chief-mib",
                   "640")
    assert "error" not in result, result
    assert result["exit_codes"] == {"chief0": 0, "worker0": 0, "worker1": 0, "ps0": 0, "ps1": 0}
    assert result["table_mib"] > 1000 and result["built_on_servers"] == "RemoteVariable"
    assert result["iterations"] == [8, 8]
    assert "lives on the parameter servers" in result["get_weights_refused"]
    peaks = result["peak_rss_mib"]
    assert 0 < peaks["chief0"] < 640 < result["table_mib"] * 0.6, peaks
    # The workers, at the demo's default cap of 512 MiB, under half the table each.
    assert 0 < peaks["worker0"] < 512 and 0 < peaks["worker1"] < 512, peaks
    assert min(peaks["ps0"], peaks["ps1"]) > result["table_mib"] / 2, peaks  # shards are there
