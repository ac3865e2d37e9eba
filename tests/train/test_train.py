"""``stratax train``: the main job end to end in its own process, and its flags, errors and
helpers in this one."""

from __future__ import annotations

import math
import os
import pathlib
import re
import signal
import subprocess
import sys

import jax
import pytest

from stratax._src import cli
from stratax._src.train.config import MODEL_NAMES, TrainConfig, check_batch_size
from stratax._src.train.models import MODELS
from stratax._src.train.runner import SUMMARY_PREFIX, throughput

REPO = pathlib.Path(__file__).resolve().parents[2]


SUMMARY_RE = re.compile(
    re.escape(SUMMARY_PREFIX) + r" test accuracy (?P<acc>[0-9.]+) \| (?P<rate>[0-9,]+) train "
    r"samples/s \(median of epochs 2-3\) \| (?P<replicas>\d+) replicas? \| (?P<strategy>\S+) "
    r"\((?P<cls>\w+)\)"
)


def _run(args: list[str], timeout: float, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess:
    """Runs ``python args`` in its own process group; kills the group if it overruns."""
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{args} ran past {timeout} s.\nstdout:\n{out}\nstderr:\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.timeout(150)
def test_train_two_cpu_replicas_end_to_end():
    result = _run(["-m", "stratax._src.cli", "train", "--epochs", "3", "--devices", "2",
                   "--verbose", "2", "--min-accuracy", "0.88"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "MirroredStrategy with 2 replicas [cpu:0, cpu:1], global batch 64 (32 per replica)" \
        in result.stdout
    assert "Epoch 3/3" in result.stdout  # Keras' per-epoch progress lines
    match = SUMMARY_RE.search(result.stdout)
    assert match, result.stdout
    assert match["replicas"] == "2"
    assert (match["strategy"], match["cls"]) == ("mirrored", "MirroredStrategy")
    # 10 classes: chance is 0.1; 3 epochs with the default seed 0 give 0.8942 on every run.
    assert 0.88 <= float(match["acc"]) <= 1.0
    assert float(match["rate"].replace(",", "")) > 0


def test_batch_size_that_does_not_split_is_a_usage_error(capsys):
    replicas = len(jax.local_devices())  # the conftest's forced CPU devices
    assert replicas > 1
    code = cli.main(["train", "--batch-size", str(replicas * 8 + 1), "--verbose", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"Global batch size {replicas * 8 + 1} does not split over {replicas} replicas" in err
    assert f"stratax train --batch-size={replicas * 8}" in err  # the suggested fix


def test_unknown_strategy_is_rejected_with_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--strategy", "no_such_strategy"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'no_such_strategy'" in err
    assert "'mirrored'" in err and "'one_device'" in err


def test_devices_after_jax_started_fails_clearly(capsys):
    have = len(jax.local_devices())  # makes sure JAX has started in this process
    code = cli.main(["train", "--devices", str(have + 1), "--verbose", "0"])
    assert code == 1
    assert f"cannot be split into {have + 1}" in capsys.readouterr().err


def test_below_min_accuracy_exits_1_after_printing_the_summary(capsys):
    code = cli.main(["train", "--strategy", "one-device", "--epochs", "1", "--verbose", "0",
                     "--min-accuracy", "1.0"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "1 replica | one_device (OneDeviceStrategy)" in out
    assert "is below --min-accuracy 1.0" in err


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "--epochs must be a positive integer; received 0"),
    (["--devices", "0"], "--devices must be a positive integer; received 0"),
    (["--min-accuracy", "95"], "--min-accuracy must be between 0 and 1; received 95.0"),
    (["--learning-rate", "-1"], "--learning-rate must be positive"),
])
def test_bad_flags_are_usage_errors(capsys, flags, message):
    assert cli.main(["train", *flags]) == 2
    assert message in capsys.readouterr().err


def test_config_and_throughput_helpers():
    TrainConfig(devices=2, epochs=5, model="cnn").validate()
    assert sorted(MODELS) == sorted(MODEL_NAMES)  # the flag's choices are the buildable models
    with pytest.raises(ValueError, match="Unknown model 'resnet'"):
        TrainConfig(model="resnet").validate()
    check_batch_size(64, 8)
    with pytest.raises(ValueError, match=r"multiple of 3, e\.g\. `stratax train --batch-size=63`"):
        check_batch_size(64, 3)
    # The first (compiling) epoch is ignored; the median resists one slow epoch.
    steady, mean, timed = throughput([9.0, 1.0, 1.0, 4.0], samples_per_epoch=100)
    assert (steady, timed) == (100.0, 3) and mean == pytest.approx(50.0)
    steady, _, timed = throughput([2.0], samples_per_epoch=100)
    assert (steady, timed) == (50.0, 1)
    assert math.isnan(throughput([0.0], 100)[0])
