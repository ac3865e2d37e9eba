"""Errors the launcher raises before any worker runs, each naming the value and the fix."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from stratax._src.launch import LaunchConfig, LaunchError, launch, parse_address

NEVER_RUN = 'record_pid("ran_%d" % RANK)\n'


@pytest.mark.timeout(15)
def test_coordinator_port_in_use_on_node_zero(scripts, listening_socket):
    script = scripts.write("never.py", NEVER_RUN)
    address = f"127.0.0.1:{listening_socket.getsockname()[1]}"
    with pytest.raises(LaunchError, match=rf"{address} .*already in use.*omit --coordinator"):
        launch([sys.executable, script], nproc_per_node=2, coordinator=address,
               stream_output=False)
    with pytest.raises(LaunchError, match=address):
        launch([sys.executable, script], nproc_per_node=1, nnodes=2, node_rank=0,
               coordinator=address, stream_output=False)
    assert not list(scripts.out.glob("ran_*.pid"))


@pytest.mark.timeout(15)
def test_cli_reports_port_in_use_as_one_error_line(scripts, run_cli, listening_socket):
    script = scripts.write("never.py", NEVER_RUN)
    address = f"127.0.0.1:{listening_socket.getsockname()[1]}"
    proc = run_cli("--nproc-per-node", "2", "--coordinator", address, script)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert stderr.startswith("stratax launch: error: Coordinator address " + address)


@pytest.mark.timeout(15)
def test_unreachable_coordinator_fails_after_the_bounded_wait(scripts):
    script = scripts.write("never.py", NEVER_RUN)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    started = time.monotonic()
    with pytest.raises(LaunchError, match=rf"Cannot reach the coordinator at {address} .*0\.5 s"):
        launch([sys.executable, script], nproc_per_node=1, nnodes=2, node_rank=1,
               coordinator=address, coordinator_wait=0.5, stream_output=False)
    assert time.monotonic() - started < 4
    assert not list(scripts.out.glob("ran_*.pid"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nproc_per_node": 0}, "nproc_per_node must be >= 1, got 0"),
        ({"nnodes": 2, "node_rank": 2, "coordinator": "h:1"}, "node_rank 2 is out of range"),
        ({"node_rank": -1}, "node_rank must be >= 0, got -1"),
        ({"nnodes": 2}, "nnodes=2 needs --coordinator host:port"),
        ({"coordinator": "no-port"}, "must be 'host:port'.*'no-port'"),
        ({"coordinator": "h:70000"}, "port must be in 1..65535, got 70000"),
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
        ({"timeout": 0}, "timeout must be > 0 seconds, got 0"),
    ],
)
def test_invalid_settings_are_rejected_with_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LaunchConfig(**kwargs)


def test_bad_commands_are_rejected(tmp_path):
    with pytest.raises(TypeError, match="non-empty list of strings"):
        launch("python train.py", stream_output=False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Cannot start worker 0.*no-such-binary"):
        launch([str(tmp_path / "no-such-binary")], stream_output=False)


@pytest.mark.timeout(15)
def test_cli_rejects_missing_script_and_bad_flags(run_cli):
    proc = run_cli("--nproc-per-node", "2", "missing_script.py")
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 2 and "'missing_script.py' not found" in stderr
    proc = run_cli("--nproc-per-node", "0", "-m", "json.tool")
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 2 and "nproc_per_node must be >= 1, got 0" in stderr


def test_parse_address_handles_ipv6_brackets():
    address = parse_address("[::1]:29500")
    assert (address.host, address.port, str(address)) == ("::1", 29500, "[::1]:29500")
