"""``benchmarks/workloads/update_rule.py``: the commands it runs and how it summarises the runs (the
runs themselves take about a minute each: ``python -m benchmarks.workloads.update_rule``)."""

from pathlib import Path

from benchmarks.workloads import update_rule


def _run(rule, seed, accuracy):
    return {"rule": rule, "seed": seed, "steps": [40, 80, 160], "accuracy": accuracy,
            "seconds": 10.0 + seed}


def test_each_rule_runs_the_guides_model_where_it_should():
    one = update_rule.command("one-device", Path("o.json"), 3)
    assert "launch" not in one and one[-3:] == ["one-device", "o.json", "3"]
    for rule in ("dense", "lazy"):
        cmd = update_rule.command(rule, Path("o.json"), 1)
        assert cmd[cmd.index("launch"):cmd.index("launch") + 5] == [
            "launch", "--workers", "2", "--ps", "2"]
        assert cmd[-3:] == [rule, "o.json", "1"]


def test_the_summary_takes_the_median_and_range_at_each_step(tmp_path):
    runs = [_run("dense", 0, [0.1, 0.5, 0.7]), _run("dense", 1, [0.2, 0.3, 0.9]),
            _run("dense", 2, [0.3, 0.4, 0.8]), _run("lazy", 0, [0.1, 0.2, 0.6])]
    table = update_rule.summarize(runs)
    assert list(table) == ["dense", "lazy"]
    assert table["dense"]["median"] == [0.2, 0.4, 0.8]
    assert (table["dense"]["min"], table["dense"]["max"]) == ([0.1, 0.3, 0.7], [0.3, 0.5, 0.9])
    assert table["dense"]["runs"] == 3 and table["dense"]["median_seconds"] == 11.0
    meta = {"date": "d", "machine": "m", "load": "l", "command": "c"}
    text = update_rule.markdown(table, meta)
    assert "| dense | 3 | 0.200 [0.100-0.300] | 0.400 [0.300-0.500] | 0.800 [0.700-0.900] |" \
        in text
    update_rule.plot(table, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000
