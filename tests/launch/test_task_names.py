"""Tasks are named as TF_CONFIG names them (issue 49): ``chief 0``, ``worker 1``, ``ps 2``.

``stratax launch --workers 2 --ps 3`` starts a chief, two workers and three ps tasks; its output
prefixes, log files, failure summaries and the events the dashboard reads used to say
``worker <local rank>`` for all six (the chief was "worker 0", ps 2 "worker 5").
"""

from __future__ import annotations

import json

import pytest

from stratax._src.core import env as env_names
from stratax._src.launch import launch, python_command

# Six processes of `--workers 2 --ps 3`, in rank order, with their TF_CONFIG tasks.
TASKS = ["chief 0", "worker 0", "worker 1", "ps 0", "ps 1", "ps 2"]
PS_JOB = {env_names.STRATAX_PS_ROLES: "2,3"}

SAY = '''
task = json.loads(os.environ["TF_CONFIG"])["task"]
print("hello from", task["type"], task["index"], os.environ["STRATAX_TASK_NAME"])
'''


def _events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.timeout(60)
def test_prefixes_logs_and_events_use_tf_config_names(scripts, tmp_path, capsys):
    script = scripts.write("say.py", SAY)
    result = launch(python_command(script), nproc_per_node=6, env=PS_JOB,
                    log_dir=str(tmp_path / "logs"), run_dir=str(tmp_path / "run"))
    assert result.ok, result.summary
    relayed = capsys.readouterr().out.splitlines()
    for name in TASKS:
        file_name = name.replace(" ", "_")
        assert f"[{name}] hello from {name} {file_name}" in relayed, relayed
        log = (tmp_path / "logs" / f"{file_name}.log").read_text().splitlines()
        assert log[0].startswith(f"--- stratax launch: {name}, restart 0")
    assert not any(line.startswith(("[worker 3]", "[worker 5]")) for line in relayed)
    (start,) = [e for e in _events(tmp_path / "run") if e["kind"] == "start"]
    assert start["tasks"] == [name.replace(" ", "_") for name in TASKS]
    assert start["ranks"] == list(range(6))


FAIL_AT = '''
if RANK == int(sys.argv[1]):
    for rank in range(6):
        if rank != RANK:
            wait_for("up_%d.pid" % rank)
    print("giving up", flush=True)
    sys.exit(3)
record_pid("up_%d" % RANK)
time.sleep(60)
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank, name", [(0, "chief 0"), (5, "ps 2")])
def test_failure_summary_and_event_name_the_task(scripts, tmp_path, capsys, rank, name):
    script = scripts.write("fail_at.py", FAIL_AT)
    result = launch(python_command(script, [str(rank)]), nproc_per_node=6, env=PS_JOB,
                    grace_period=2.0, log_dir=str(tmp_path / "logs"),
                    run_dir=str(tmp_path / "run"))
    assert result.exit_code == 3 and result.failure is not None
    assert result.failure.name == name
    first, *rest = result.summary.splitlines()
    assert first.startswith(f"stratax launch: {name} (local rank {rank}, pid ")
    assert f"  [{name}] giving up" in rest
    assert rest[-1].endswith(f"{name.replace(' ', '_')}.log")
    assert f"[{name}] giving up" in capsys.readouterr().out.splitlines()
    (failure,) = [e for e in _events(tmp_path / "run") if e["kind"] == "failure"]
    assert (failure["task"], failure["rank"]) == (name.replace(" ", "_"), rank)
    assert failure["message"].startswith(f"{name} (local rank {rank}, ")
