"""The launcher's journal in an observed run: starts, the failing task with its root cause,
restarts and the end, in ``<run_dir>/events.jsonl``; workers get ``STRATAX_RUN_DIR``."""

from __future__ import annotations

import json
import sys

import pytest

from stratax._src.launch import launch
from stratax._src.observe.reader import RunReader

# Worker 1 fails on the first start only, with a chained exception 30 frames deep (a traceback
# longer than the launcher's summary quotes); every worker records the run directory it was
# given (atomically: worker 0 of the first start may be stopped at any point).
SCRIPT = '''
import os, sys
rank = int(os.environ["STRATAX_PROCESS_ID"])
restart = int(os.environ["STRATAX_RESTART_COUNT"])
part = os.path.join({out!r}, f"part_{{rank}}_{{restart}}")
with open(part, "w") as f:
    f.write(os.environ.get("STRATAX_RUN_DIR", ""))
os.replace(part, os.path.join({out!r}, f"env_{{rank}}_{{restart}}"))
exec("".join("def f%d():\\n    return f%d()\\n" % (i, i + 1) for i in range(30))
     + "def f30():\\n    raise ValueError('boom at the bottom')\\n")
if rank == 1 and restart == 0:
    try:
        f0()
    except ValueError as err:
        raise RuntimeError("boom on worker one") from err
'''


@pytest.mark.timeout(60)
def test_failure_with_root_cause_and_restart_are_journaled(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(SCRIPT.format(out=str(tmp_path)))
    run_dir = tmp_path / "run"
    result = launch([sys.executable, str(script)], nproc_per_node=2, max_restarts=1,
                    stream_output=False, run_dir=str(run_dir))
    assert result.ok and result.restarts == 1

    events = RunReader(run_dir).snapshot()["events"]
    assert [e["kind"] for e in events] == ["start", "failure", "restart", "start", "end"]
    start, failure, restart, _, end = events
    assert start["tasks"] == ["worker_0", "worker_1"] and len(start["pids"]) == 2
    assert failure["task"] == "worker_1" and failure["returncode"] == 1
    assert failure["pid"] in start["pids"] and "exit code 1" in failure["message"]
    assert failure["tail"][-1] == "RuntimeError: boom on worker one"
    # The whole traceback, both exceptions of the chain and every frame, in order.
    traceback = failure["traceback"]
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[-1] == "RuntimeError: boom on worker one"
    assert "ValueError: boom at the bottom" in traceback
    assert ("The above exception was the direct cause of the following exception:"
            in traceback)
    assert [line.split()[-1] for line in traceback if "in f" in line] == [
        f"f{i}" for i in range(31)]
    assert not any("left out" in line for line in traceback)
    assert restart["restart"] == 1 and end["exit_code"] == 0
    recorded = {p.name: p.read_text() for p in tmp_path.glob("env_*")}
    # Worker 0 of the first start may be stopped before it writes; every other start does.
    assert {"env_1_0", "env_0_1", "env_1_1"} <= set(recorded)
    assert set(recorded.values()) == {str(run_dir.resolve())}


def test_unobserved_launch_writes_no_journal(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "ok.py"
    script.write_text("import os, json; print(json.dumps('STRATAX_RUN_DIR' in os.environ))")
    result = launch([sys.executable, str(script)], nproc_per_node=1, stream_output=False,
                    capture_output=True)
    assert result.ok and json.loads(result.outputs[0][-1]) is False
    assert not list(tmp_path.rglob("events.jsonl"))
