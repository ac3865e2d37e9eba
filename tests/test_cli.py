"""The ``stratax`` command: ``train`` end to end in a subprocess, its errors, ``launch --help``,
and the embedded digits it trains on."""

from __future__ import annotations

import fnmatch
import importlib.resources
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import tomllib

import jax
import numpy as np
import pytest

from stratax._src import cli
from stratax._src.train.config import MODEL_NAMES, TrainConfig, check_batch_size
from stratax._src.train.models import MODELS
from stratax._src.train.runner import SUMMARY_PREFIX, throughput
from stratax.datasets import load_digits

REPO = pathlib.Path(__file__).resolve().parents[1]
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


# ------------------------------------------------------------------ stratax train (subprocess)
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


@pytest.mark.timeout(60)
def test_launch_help_lists_the_launcher_flags():
    result = _run(["-m", "stratax._src.cli", "launch", "--help"], timeout=50)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: stratax launch")
    for flag in ("--nproc-per-node", "--max-restarts", "--timeout", "--module"):
        assert flag in result.stdout


# ------------------------------------------------------------------ stratax train (in process)
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


# ------------------------------------------------------------------ embedded digits
def test_load_digits_shapes_dtypes_and_ranges():
    (x_train, y_train), (x_test, y_test) = load_digits()
    assert x_train.shape == (1438, 64) and x_test.shape == (359, 64)
    assert x_train.dtype == x_test.dtype == np.float32
    assert y_train.dtype == y_test.dtype == np.int32
    assert y_train.shape == (1438,) and y_test.shape == (359,)
    for x in (x_train, x_test):
        assert x.min() == 0.0 and x.max() == 1.0
    # Stratified: every digit in both parts, about 20% of each held out.
    train_counts = np.bincount(y_train, minlength=10)
    test_counts = np.bincount(y_test, minlength=10)
    assert np.all(train_counts > 130) and np.all((test_counts >= 35) & (test_counts <= 37))
    (images, labels), _ = load_digits(flatten=False)
    assert images.shape == (1438, 8, 8, 1)
    np.testing.assert_array_equal(images.reshape(1438, 64), x_train)
    np.testing.assert_array_equal(labels, y_train)


def test_load_digits_split_is_deterministic_per_seed():
    first, second, other = load_digits(split_seed=3), load_digits(split_seed=3), load_digits()
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(first[1][0], other[1][0])
    (x_train, _), (x_test, _) = load_digits(test_fraction=0.5)
    assert len(x_train) + len(x_test) == 1797 and abs(len(x_test) - 899) <= 5
    with pytest.raises(ValueError, match="test_fraction must be strictly between 0 and 1"):
        load_digits(test_fraction=1.0)


def test_digits_file_is_package_data():
    resource = importlib.resources.files("stratax._src.datasets").joinpath("digits.npz")
    assert resource.is_file()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["stratax"]
    assert any(fnmatch.fnmatch("_src/datasets/digits.npz", p) for p in patterns)
    assert (REPO / "stratax" / "_src" / "datasets" / "__init__.py").is_file()  # a real package


# ------------------------------------------------------------------ usage and logging
@pytest.mark.parametrize(
    "argv, usage",
    [
        (["train", "--bogus"], "usage: stratax train"),
        (["launch", "--bogus", "prog.py"], "usage: stratax launch"),
        (["server", "--bogus"], "usage: stratax server"),
        (["dashboard", "run", "--bogus"], "usage: stratax dashboard"),
    ],
)
def test_a_bad_flag_prints_its_subcommands_usage(argv, usage, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert usage in err
    assert "unrecognized arguments: --bogus" in err
    assert "usage: stratax [-h]" not in err


def test_command_skips_the_log_level_value():
    assert cli._command(["--log-level", "info", "train", "--epochs", "1"]) == "train"
    assert cli._command(["--log-level", "debug"]) is None


def test_log_level_flag_shows_stratax_records_and_reaches_children(monkeypatch, capsys):
    import logging

    from stratax._src.core import env, logs

    logger = logging.getLogger("stratax")
    before = (logger.level, list(logger.handlers))
    monkeypatch.delenv(env.STRATAX_LOG_LEVEL, raising=False)
    seen = {}

    def handler(args):
        seen["env"] = os.environ.get(env.STRATAX_LOG_LEVEL)
        logging.getLogger("stratax._src.cluster.detect").info("detected something")
        logging.getLogger("stratax._src.cluster.detect").debug("hidden detail")
        return 0

    monkeypatch.setattr(cli, "_run_server", handler)
    try:
        assert cli.main(["--log-level", "info", "server"]) == 0
    finally:
        logger.setLevel(before[0])
        logger.handlers[:] = before[1]
        # main() exported the level for the processes it starts.
        os.environ.pop(env.STRATAX_LOG_LEVEL, None)
    err = capsys.readouterr().err
    assert seen["env"] == "info"
    assert "stratax INFO stratax._src.cluster.detect: detected something" in err
    assert "hidden detail" not in err
    with pytest.raises(ValueError, match=r"'loud' is not one of debug, info, warning, error"):
        logs.configure("loud")
