"""``benchmarks/workloads/sharded_checkpoint.py``: its plan and how it merges a pair's figures
and summarises the pairs (a run starts 2 processes per writer and repetition, about 20 s
each: ``python -m benchmarks.workloads.sharded_checkpoint --reps 1 --mib 8`` is its smoke)."""

import pytest

from benchmarks.workloads import sharded_checkpoint


def _process(save_s, restore_s, files=21, imported=None):
    result = {"save_s": save_s, "restore_s": restore_s, "save_rss_mib": 50.0 + save_s,
              "restore_rss_mib": 13.0, "held_mib": 100.0, "files": files, "disk_mib": 200.0,
              "dropped_cache": True}
    return result if imported is None else {**result, "import_s": imported}


def test_the_dry_run_plans_both_writers_per_repetition_and_runs_nothing(capsys):
    assert sharded_checkpoint.main(["--dry-run", "--reps", "2", "--mib", "200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[1].split(",")[0] for line in lines] == [
        "stratax", "orbax", "stratax", "orbax"]
    assert "4 kernels 4096 x 3200 float32 (200 MiB)" in lines[0]


def test_a_size_below_one_mib_is_refused():
    with pytest.raises(ValueError, match="--mib must be at least 1, got 0"):
        sharded_checkpoint.main(["--dry-run", "--mib", "0"])


def test_a_pair_counts_its_slower_process_and_the_writers_their_median_pair():
    pair = sharded_checkpoint._merge([_process(1.0, 0.5, imported=1.4),
                                      _process(2.0, 0.4, files=0, imported=2.0)])
    assert (pair["save_s"], pair["restore_s"], pair["save_rss_mib"]) == (2.0, 0.5, 52.0)
    assert (pair["files"], pair["import_s"]) == (21, 2.0)  # process 0 counts the files
    pairs = [sharded_checkpoint._merge([_process(s, s / 2)] * 2) for s in (3.0, 1.0, 2.0)]
    rows = sharded_checkpoint._rows({"stratax": pairs, "orbax": [{"error": "not installed"}]})
    assert rows["stratax"]["save_s"] == 2.0 and rows["stratax"]["restore_s"] == 1.0
    assert rows["stratax"]["dropped_cache"] is True
    assert rows["orbax"] == {"error": "not installed"}
