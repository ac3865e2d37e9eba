"""Output relay: ``[worker i]`` prefixes on stdout and stderr, log files, and the CLI front end."""

from __future__ import annotations

import argparse
import sys

import pytest

from stratax._src.launch import (
    add_launch_arguments,
    command_from_args,
    launch,
    python_command,
)

TALK = '''
print("out-%d-a" % RANK)
print("err-%d" % RANK, file=sys.stderr)
sys.stdout.write("out-%d-b no newline at end" % RANK)
'''


@pytest.mark.timeout(30)
def test_cli_prefixes_each_stream_and_writes_log_files(scripts, run_cli, tmp_path):
    script = scripts.write("talk.py", TALK)
    proc = run_cli("--nproc-per-node", "2", "--log-dir", str(tmp_path / "logs"), script,
                   real_entry_point=True)
    stdout, stderr = proc.communicate(timeout=25)
    assert proc.returncode == 0, stderr
    out_lines, err_lines = stdout.splitlines(), stderr.splitlines()
    for rank in (0, 1):
        assert f"[worker {rank}] out-{rank}-a" in out_lines
        assert f"[worker {rank}] out-{rank}-b no newline at end" in out_lines
        assert f"[worker {rank}] err-{rank}" in err_lines
        assert not any(f"err-{rank}" in line for line in out_lines)
        log = (tmp_path / "logs" / f"worker_{rank}.log").read_text().splitlines()
        assert log[0].startswith(f"--- stratax launch: worker {rank}, restart 0")
        assert sorted(log[1:]) == sorted(
            [f"out-{rank}-a", f"err-{rank}", f"out-{rank}-b no newline at end"])


@pytest.mark.timeout(20)
def test_module_mode_and_captured_output(tmp_path, capsys):
    (tmp_path / "tinymod.py").write_text(
        "import os, sys\nprint('mod', os.environ['STRATAX_PROCESS_ID'], sys.argv[1:])\n")
    result = launch(python_command("tinymod", ["--flag", "x"], module=True), nproc_per_node=2,
                    cwd=str(tmp_path), capture_output=True)
    assert result.ok, result.summary
    assert result.outputs == {0: ["mod 0 ['--flag', 'x']"], 1: ["mod 1 ['--flag', 'x']"]}
    relayed = capsys.readouterr().out.splitlines()
    assert "[worker 1] mod 1 ['--flag', 'x']" in relayed


def test_parser_splits_launcher_flags_from_program_args():
    parser = argparse.ArgumentParser()
    add_launch_arguments(parser)
    args = parser.parse_args(["--nproc-per-node", "3", "--max-restarts", "2", "--timeout", "9",
                              "train.py", "--nproc-per-node", "7", "-m"])
    assert (args.nproc_per_node, args.max_restarts, args.timeout) == (3, 2, 9.0)
    assert (args.program, args.program_args, args.module) == (
        "train.py", ["--nproc-per-node", "7", "-m"], False)
    args = parser.parse_args(["--nnodes", "2", "--node-rank", "1", "--coordinator", "h:1",
                              "-m", "pkg.train", "--", "--lr", "1"])
    assert (args.nnodes, args.node_rank, args.coordinator) == (2, 1, "h:1")
    assert command_from_args(args) == [sys.executable, "-m", "pkg.train", "--lr", "1"]
    args = parser.parse_args(["script_that_is_not_here.py", "--", "--lr", "1"])
    assert args.program_args[-2:] == ["--lr", "1"]
    with pytest.raises(ValueError, match=r"script_that_is_not_here\.py' not found"):
        command_from_args(args)


def test_python_command_rejects_a_missing_script(tmp_path):
    missing = str(tmp_path / "nope.py")
    with pytest.raises(ValueError, match=r"nope\.py' not found"):
        python_command(missing)
    assert python_command("pkg.mod", ["a"], module=True) == [sys.executable, "-m", "pkg.mod", "a"]
