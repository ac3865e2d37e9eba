"""``benchmarks.workloads.input_pipelines``' plumbing in milliseconds: its plan, summary and table
on fake results, and its refusal of too few repetitions. No model is trained here."""

from __future__ import annotations

import pytest

from benchmarks.workloads import input_pipelines as bench


def test_plan_interleaves_every_system_in_every_repetition_in_rotated_order():
    systems, pipelines = ["keras", "sx-onedevice", "sx-mirrored"], ["tf.data", "grain"]
    full = bench.plan(3, False, systems, pipelines)
    assert [[child[0][0] for child in rep] for rep in full] == [
        ["keras", "sx-onedevice", "sx-mirrored"],
        ["sx-onedevice", "sx-mirrored", "keras"],
        ["sx-mirrored", "keras", "sx-onedevice"]]
    assert [[p for _, p in child] for child in full[1]] == [["grain", "tf.data"]] * 3
    quick = bench.plan(3, True, systems, pipelines)
    assert [len(rep) for rep in quick] == [1, 1, 1]  # one interpreter per repetition
    assert sorted(quick[2][0]) == sorted((s, p) for s in systems for p in pipelines)


def test_summary_gives_ratios_to_plain_keras_per_repetition_and_marks_failures():
    records = [{"rep": rep, "pipeline": "tf.data", "system": system, "status": "ok",
                "samples_per_s": rate * (1 + rep / 10)}
               for rep in range(3) for system, rate in (("keras", 1000.0), ("sx-mirrored", 950.0))]
    records.append({"rep": 0, "pipeline": "tf.data", "system": "sx-onedevice",
                    "status": "failed", "reason": "ValueError: boom"})
    rows = bench.summarize(records, ["keras", "sx-mirrored", "sx-onedevice"], ["tf.data"])
    keras_row, mirrored, onedevice = rows
    assert keras_row["ratio_median"] == 1.0
    assert mirrored["ratios"] == pytest.approx([0.95] * 3)
    assert mirrored["median"] == pytest.approx(1045.0)
    assert (mirrored["min"], mirrored["max"]) == pytest.approx((950.0, 1140.0))
    assert onedevice["n"] == 0 and onedevice["failed"] == ["ValueError: boom"]
    meta = {"workload": "mlp", "command": "python -m benchmarks.workloads.input_pipelines --quick",
            "date": "2026-12-04 18:00 UTC", "cpu_model": "Fake CPU", "cpu_count": 2,
            "loadavg_before": (1.5, 1, 1), "loadavg_after": (2.25, 1, 1), "reps": 3,
            "isolation": "one interpreter per repetition", "steps_per_epoch": 40,
            "timed_epochs": 3, "versions": {"jax": "0.0-fake"}}
    table = bench.markdown(meta, rows)
    assert "Fake CPU" in table and "1.50 / 2.25" in table
    assert "| tf.data | sx-mirrored | 1,045 | 950 | 1,140 | 0.950 | 0.95, 0.95, 0.95 |" in table
    assert "| tf.data | sx-onedevice | failed: ValueError: boom |" in table


def test_too_few_repetitions_are_refused_with_the_fix(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--reps", "2"])
    assert "use at least 3" in capsys.readouterr().err
