"""The ``stratax`` command itself: each subcommand's usage and help, and ``--log-level``.
``stratax train`` is tested in ``tests/train/``, ``launch`` in ``tests/launch/``."""

from __future__ import annotations

import os

import pytest

from stratax._src import cli


def test_launch_help_lists_the_launcher_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["launch", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: stratax launch")
    for flag in ("--nproc-per-node", "--max-restarts", "--timeout", "--module"):
        assert flag in out


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
