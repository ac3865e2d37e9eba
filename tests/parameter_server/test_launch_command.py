"""`stratax launch --workers W --ps P`: chief/worker/ps TF_CONFIG, and a whole run."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stratax._src.launch.child_env import parameter_server_tf_config

HERE = Path(__file__).parent
EXAMPLE = HERE.parents[1] / "examples" / "parameter_server_custom_loop.py"


def test_roles_by_rank():
    addresses = [f"127.0.0.1:{port}" for port in range(1000, 1005)]
    configs = [json.loads(parameter_server_tf_config(addresses, r, 2, 2)) for r in range(5)]
    assert configs[0]["cluster"] == {"chief": addresses[:1], "worker": addresses[1:3],
                                     "ps": addresses[3:]}
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0}, {"type": "worker", "index": 0},
        {"type": "worker", "index": 1}, {"type": "ps", "index": 0}, {"type": "ps", "index": 1}]
    with pytest.raises(ValueError, match="1 \\+ workers \\+ ps"):
        parameter_server_tf_config(addresses, 0, 2, 1)


@pytest.mark.timeout(150)
def test_launch_runs_the_parameter_server_example():
    """The ported guide program on chief + 2 workers + 2 ps through `stratax launch`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STRATAX_") and k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
    proc = subprocess.run(
        [sys.executable, "-m", "stratax._src.cli", "launch", "--workers", "2", "--ps", "2",
         "--timeout", "120", str(EXAMPLE), "--steps", "150"],
        check=False, env=env, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"embedding .* 0: rows 0-4999 +ps \d", out), out[-3000:]
    assert re.search(r"embedding .* 1: rows 5000-9999 +ps \d", out), out[-3000:]
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < first
    steps = re.search(r"steps per worker: \{'worker 0': (\d+), 'worker 1': (\d+)\}", out)
    assert steps and int(steps[1]) + int(steps[2]) == 150


@pytest.mark.timeout(150)
def test_launch_runs_the_keras_fit_example_on_the_guides_tf_data():
    """The guide's `model.fit` part: each worker builds the `tf.data` pipeline of its
    `dataset_fn`; the model learns (held-out accuracy far above chance, 0.1)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STRATAX_") and k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
    proc = subprocess.run(
        [sys.executable, "-m", "stratax._src.cli", "launch", "--workers", "2", "--ps", "2",
         "--timeout", "120", str(EXAMPLE.with_name("parameter_server_keras_fit.py")),
         "--epochs", "3", "--steps", "60"],
        check=False, env=env, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"loss ([\d.]+) -> ([\d.]+); held-out accuracy ([\d.]+); "
                      r"optimizer.iterations (\d+)", proc.stdout)
    assert found, proc.stdout[-3000:]
    first, last, accuracy, iterations = found.groups()
    assert float(last) < 0.9 * float(first) and float(accuracy) > 0.2, found[0]
    assert int(iterations) == 180


def test_flags_go_together(capsys):
    from stratax._src.cli import main

    assert main(["launch", "--workers", "2", str(EXAMPLE)]) == 2
    assert "--workers and --ps go together" in capsys.readouterr().err


def test_launch_gives_each_run_its_own_token(monkeypatch):
    import argparse

    from stratax._src.launch.arguments import parameter_server_layout

    args = argparse.Namespace(workers=2, ps=1, nproc_per_node=1, nnodes=1)
    monkeypatch.delenv("STRATAX_PS_TOKEN", raising=False)
    monkeypatch.delenv("STRATAX_PS_TOKEN_FILE", raising=False)
    first, second = parameter_server_layout(args)[1], parameter_server_layout(args)[1]
    assert len(first["STRATAX_PS_TOKEN"]) >= 40
    assert first["STRATAX_PS_TOKEN"] != second["STRATAX_PS_TOKEN"]
    monkeypatch.setenv("STRATAX_PS_TOKEN", "mine")           # a token the user set is kept
    assert "STRATAX_PS_TOKEN" not in parameter_server_layout(args)[1]
    monkeypatch.delenv("STRATAX_PS_TOKEN")
    monkeypatch.setenv("STRATAX_PS_TOKEN_FILE", "/path/of/mine")
    assert "STRATAX_PS_TOKEN" not in parameter_server_layout(args)[1]


_TASKS_AFTER_THE_CHIEF = """
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
name = f"{task['type']}{task['index']}"
base = sys.argv[1]
first = os.environ["STRATAX_RESTART_COUNT"] == "0" and not os.path.exists(base)
with open(base + ".starts", "a") as f:
    f.write(name + "\\n")

def wait_for(ready):
    deadline = time.monotonic() + 30
    while not ready():
        if time.monotonic() > deadline:
            sys.exit(name + ": gave up waiting")
        time.sleep(0.05)

def pid_of_chief():
    try:
        return open(base + ".chief").read()
    except OSError:
        return None

if name == "chief0":
    with open(base + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(base + ".tmp", base + ".chief")
    # Trains until worker 1 came back, then asks its tasks to exit.
    wait_for(lambda: open(base + ".starts").read().split().count("worker1") == 2)
elif name == "worker1" and first:
    open(base, "w").close()
    sys.exit(1)                         # dies; restarted alone, it waits for a chief
elif name == "worker0":
    # Fails once the launcher has reaped the finished chief, so its exit comes after the
    # chief's in the launcher's order (no timing gap between the two is relied on).
    wait_for(pid_of_chief)
    chief = pid_of_chief()
    wait_for(lambda: not os.path.exists(f"/proc/{chief}"))
    sys.exit(1)
else:
    time.sleep(600)                     # a ps or restarted worker that never heard the end
"""


@pytest.mark.timeout(60)
def test_the_job_ends_with_its_chief_and_no_task_is_restarted_after_it(tmp_path):
    """A task restarted after the chief finished would wait for a chief that never comes (and
    be restarted again each time it gave up): the launch ends when the chief does."""
    from stratax._src.launch import launch

    script = tmp_path / "tasks.py"
    script.write_text(_TASKS_AFTER_THE_CHIEF)
    result = launch([sys.executable, str(script), str(tmp_path / "died")], nproc_per_node=4,
                    env={"STRATAX_PS_ROLES": "2,1"}, max_restarts=3, grace_period=2.0,
                    timeout=50, capture_output=True, stream_output=False)
    assert result.exit_code == 0 and not result.timed_out, result.summary
    assert result.elapsed < 15, result.summary
    # Only worker 1's own death was restarted; worker 0's failure after the chief was not.
    starts = (tmp_path / "died.starts").read_text().split()
    assert sorted(starts) == ["chief0", "ps0", "worker0", "worker1", "worker1"], starts


@pytest.mark.timeout(150)
def test_launch_runs_the_large_table_example(tmp_path):
    """Train a table built by its servers, checkpoint it sharded, serve it from a .keras file."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STRATAX_") and k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
    env["STRATAX_PS_BUILD_ON_SERVERS_BYTES"] = "1000000"  # the 6.4 MB table of this run
    proc = subprocess.run(
        [sys.executable, "-m", "stratax._src.cli", "launch", "--workers", "2", "--ps", "2",
         "--timeout", "120", str(EXAMPLE.with_name("parameter_server_large_table.py")),
         "--rows", "100000", "--steps", "40", "--out", str(tmp_path)],
        check=False, env=env, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "served predictions equal the trained model's: True" in proc.stdout, proc.stdout
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", proc.stdout).groups())
    assert last < first
    assert sorted(p.name for p in (tmp_path / "checkpoint" / "v1").iterdir()) == [
        "manifest.json", "ps0", "ps1"]
