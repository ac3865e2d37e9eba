"""``stratax train --run-dir/--dashboard`` and ``stratax dashboard RUN_DIR`` (in-process)."""

from __future__ import annotations

import argparse
import json
import threading
import urllib.request

from stratax._src import cli
from stratax._src.observe import record as record_mod
from stratax._src.observe.arguments import run_dashboard


def test_train_with_dashboard_reports_every_epoch(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code = cli.main(["train", "--strategy", "one-device", "--epochs", "2", "--verbose", "0",
                     "--dashboard", "--run-dir", str(run_dir)])
    record_mod.close_all()
    assert code == 0
    err = capsys.readouterr().err
    assert "stratax train: dashboard: http://127.0.0.1:" in err
    assert f"view it with: stratax dashboard {run_dir}" in err
    records = [json.loads(x) for x in (run_dir / "metrics" / "main.jsonl").read_text().split()]
    assert [r["epoch"] for r in records if r.get("epoch_end")] == [0, 1]
    kinds = [json.loads(x)["kind"] for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert kinds == ["start", "end"]


def test_dashboard_command_serves_a_saved_run(tmp_path, capsys):
    record_mod.record(step=3, run_dir=tmp_path, task="worker_0", loss=0.5)
    record_mod.close_all()
    stop = threading.Event()
    args = argparse.Namespace(run_dir=str(tmp_path), host="127.0.0.1", port=0)
    codes = []
    thread = threading.Thread(target=lambda: codes.append(run_dashboard(args, stop)))
    thread.start()
    try:
        for _ in range(100):
            err = capsys.readouterr().err
            if "serving" in err:
                break
            stop.wait(0.05)
        url = err.split(" at ")[1].split()[0]
        with urllib.request.urlopen(url + "api/data", timeout=5) as response:
            assert json.load(response)["tasks"]["worker_0"]["step"] == 3
    finally:
        stop.set()
        thread.join(timeout=10)
    assert codes == [0]


def test_dashboard_command_on_a_missing_directory_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["dashboard", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
