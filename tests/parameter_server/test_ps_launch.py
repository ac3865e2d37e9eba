"""`stratax launch --workers W --ps P`: chief/worker/ps TF_CONFIG, and a whole run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stratax._src.launch.child_env import parameter_server_tf_config

HERE = Path(__file__).parent


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


@pytest.mark.timeout(120)
def test_launch_runs_a_parameter_server_program():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STRATAX_") and k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
    proc = subprocess.run(
        [sys.executable, "-m", "stratax._src.cli", "launch", "--workers", "1", "--ps", "1",
         "--timeout", "90", str(HERE / "ps_tiny.py")],
        check=False, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if "RESULT " in l)
    assert json.loads(line.split("RESULT ", 1)[1]) == {"w": [-6.0, -6.0]}  # 3 x 0.5 x 4


def test_flags_go_together(capsys):
    from stratax._src.cli import main

    assert main(["launch", "--workers", "2", str(HERE / "ps_tiny.py")]) == 2
    assert "--workers and --ps go together" in capsys.readouterr().err
