"""The rendezvous of an elastic launch across hosts: its rounds (a fake clock, no network) and its
store over gRPC on loopback (mutual TLS keyed by the token, JSON only, bounded messages)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

import grpc
import pytest

from stratax._src.launch import launch
from stratax._src.launch.config import Address, LaunchConfig, LaunchError
from stratax._src.launch.rendezvous import MAX_MESSAGE, RendezvousClient, RendezvousStore
from stratax._src.launch.rounds import Rounds

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _rounds(minimum=1, maximum=2, max_restarts=1):
    clock, lines = Clock(), []
    rounds = Rounds(minimum, maximum, last_call=2.0, heartbeat_timeout=5.0,
                    max_restarts=max_restarts, clock=clock, log=lines.append)
    return rounds, clock, lines


def _join(rounds, node, port=1000, local=False):
    return rounds.join(node, f"10.0.0.{ord(node[0]) - 96}", port, f"node {node}", local=local)


def test_a_round_closes_at_max_at_once_and_at_min_after_the_last_call():
    rounds, clock, _ = _rounds(minimum=1, maximum=3)
    assert _join(rounds, "a", 2001)["state"] == "forming"
    clock.now += 1.5
    assert _join(rounds, "b")["state"] == "forming"  # a join restarts the last call
    clock.now += 1.5
    assert rounds.sync("a")["state"] == "forming"
    clock.now += 0.6
    running = rounds.sync("b")
    assert running == {"state": "running", "round": 0, "rank": 1, "nnodes": 2,
                       "coordinator": "10.0.0.1:2001", "nodes": ["node a", "node b"],
                       "why": "the job starts", "waiting": 0}
    full, _, _ = _rounds(minimum=1, maximum=2)
    _join(full, "a")
    assert _join(full, "b")["state"] == "running"  # MAX nodes: no last call


def test_the_stores_own_node_is_rank_0_and_the_others_keep_their_order():
    rounds, _, _ = _rounds(minimum=1, maximum=3)
    _join(rounds, "c")
    _join(rounds, "b")
    _join(rounds, "a", 3000, local=True)
    assert [rounds.state(n)["rank"] for n in "abc"] == [0, 2, 1]
    assert rounds.state("c")["coordinator"] == "10.0.0.1:3000"


def test_a_silent_node_is_dropped_and_the_others_go_on_in_a_new_round():
    rounds, clock, lines = _rounds(minimum=1, maximum=2)
    _join(rounds, "a", local=True)
    _join(rounds, "b")
    clock.now += 4.0
    assert rounds.sync("a")["state"] == "running"
    clock.now += 1.5  # b silent for 5.5 s, a for 1.5 s
    assert rounds.sync("a") == {"state": "join", "round": 1}
    assert "round 1 opens: node b is lost (no heartbeat for 5 s)" in lines[-1], lines
    assert rounds.sync("b") == {"state": "join", "round": 1}  # b is no longer known
    _join(rounds, "a", 2002, local=True)
    clock.now += 2.0
    alone = rounds.sync("a")
    assert (alone["state"], alone["round"], alone["nnodes"], alone["rank"]) == (
        "running", 1, 1, 0)
    assert alone["coordinator"] == "10.0.0.1:2002"  # the port offered for this round
    assert rounds.failures == 0  # a membership change is no restart


def test_a_node_that_arrives_while_a_round_runs_starts_the_next_up_to_max():
    rounds, clock, lines = _rounds(minimum=1, maximum=2)
    _join(rounds, "a", local=True)
    clock.now += 2.0
    assert rounds.sync("a")["state"] == "running"
    assert _join(rounds, "b")["state"] == "forming"
    assert "round 1 opens: node b arrives (the job grows, to at most 2 nodes)" in lines
    clock.now += 3.0  # past the last call: the round still waits for a, alive, to rejoin
    assert rounds.sync("b")["state"] == "forming"
    assert rounds.sync("a") == {"state": "join", "round": 1}
    _join(rounds, "a", local=True)
    grown = rounds.sync("a")
    assert (grown["state"], grown["nnodes"], grown["rank"]) == ("running", 2, 0)
    assert _join(rounds, "c") == {"state": "waiting", "round": 1}  # at MAX: a spare
    assert rounds.sync("b")["state"] == "running" and rounds.sync("b")["waiting"] == 1


def test_failed_rounds_count_against_max_restarts_and_done_nodes_finish_the_job():
    rounds, _, lines = _rounds(minimum=1, maximum=2, max_restarts=1)
    _join(rounds, "a", local=True)
    _join(rounds, "b")
    assert rounds.fail("b", 0, "worker 1 exited with code 3")["state"] == "join"
    assert rounds.fail("a", 0, "stale: round 0 is over")["state"] == "join"  # not counted
    _join(rounds, "a", local=True)
    _join(rounds, "b")  # all of round 0 is back: its failure was a restart
    assert rounds.failures == 1 and lines[-2].endswith("restart 1 of 1"), lines
    assert rounds.finish("a", 1)["state"] == "running"
    assert rounds.finish("b", 1) == {"state": "finished",
                                     "reason": "round 1's 2 node(s) finished"}
    stopping, _, _ = _rounds(minimum=1, maximum=2, max_restarts=1)
    _join(stopping, "a")
    _join(stopping, "b")
    for round_ in (0, 1):
        stopping.fail("a", round_, "worker 0 exited with code 3")
        _join(stopping, "a")
        last = _join(stopping, "b")
    assert last["state"] == "stopped" and "2 failed round(s), over --max-restarts 1" in (
        last["reason"]), last


def test_a_round_that_failed_because_a_node_was_lost_is_no_restart():
    rounds, clock, lines = _rounds(minimum=1, maximum=2, max_restarts=0)
    _join(rounds, "a", local=True)
    _join(rounds, "b")
    rounds.fail("a", 0, "worker 0: WorkerUnavailableError")  # b's host went
    clock.now += 3.0
    rounds.sync("b")  # b's agent is alive (its workers are stopping)
    _join(rounds, "a", local=True)
    clock.now += 2.5
    assert rounds.sync("a")["state"] == "forming"  # past the last call, b may rejoin
    clock.now += 3.0  # b, silent for 5.5 s, is dropped: a closes the round alone
    assert rounds.sync("a")["state"] == "running" and rounds.failures == 0
    assert "no restart counted, 1 of its node(s) left" in lines[-2], lines


@pytest.fixture
def store():
    rounds = Rounds(1, 2, last_call=0.0, heartbeat_timeout=30.0, max_restarts=0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served = RendezvousStore(rounds, Address("127.0.0.1", port), "the token")
    yield served
    served.close()


def test_an_agent_with_the_token_joins_over_tls_and_bad_messages_are_answered(store):
    client = RendezvousClient(store.address, "the token")
    try:
        reply = client.call({"op": "join", "node": "b", "port": 4000, "name": "host b"})
        assert reply["state"] == "running" and reply["coordinator"] == "127.0.0.1:4000"
        assert store.rounds.known["b"].name == "127.0.0.1 (host b)"  # the caller's address
        raw = client._channel.unary_unary("/stratax.Rendezvous/Call")
        for body, error in [(b"\xff not json", "bad rendezvous message"),
                            (b"[1, 2]", "a message is a JSON object, got list"),
                            (b'{"op": "join", "node": "c"}', "field 'port' must be a int"),
                            (b'{"op": "drop_all", "node": "c"}', "unknown op 'drop_all'")]:
            assert error in json.loads(raw(body, timeout=5))["error"]
        with pytest.raises(LaunchError, match=r"refused a message: .*'round' must be a int"):
            client.call({"op": "done", "node": "b", "round": "0"})
        with pytest.raises(grpc.RpcError) as oversize:
            raw(b" " * (MAX_MESSAGE + 1), timeout=5)
        assert oversize.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert set(store.rounds.known) == {"b"}
    finally:
        client.close()


def test_an_agent_without_the_token_is_refused_and_learns_nothing(store):
    intruder = RendezvousClient(store.address, "another token", call_timeout=3.0)
    try:
        with pytest.raises(ConnectionError, match="UNAVAILABLE") as refused:
            intruder.call({"op": "join", "node": "x", "port": 4000, "name": "intruder"})
        assert "running" not in str(refused.value) and not store.rounds.known
    finally:
        intruder.close()
    with socket.create_connection(("127.0.0.1", store.address.port), timeout=5) as plain:
        plain.sendall(b'{"op": "sync", "node": "x"}\n')  # no TLS: gRPC answers nothing
        plain.settimeout(2)
        try:
            answer = plain.recv(4096)
        except (TimeoutError, ConnectionResetError):
            answer = b""
        assert b"state" not in answer and not store.rounds.known


def test_an_agent_that_cannot_reach_the_store_stops_with_an_error_naming_it(monkeypatch):
    monkeypatch.setenv("STRATAX_PS_TOKEN", "the token")
    with socket.socket() as held:  # bound, not listening: connections are refused
        held.bind(("127.0.0.1", 0))
        address = Address("127.0.0.1", held.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(LaunchError, match=rf"Cannot reach the rendezvous store at "
                                              rf"{address} .* for 0.5 s"):
            launch([sys.executable, "-c", "pass"], nnodes=2, min_nnodes=1,
                   rdzv_endpoint=str(address), coordinator_wait=0.5, stream_output=False)
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("kwargs, message", [
    ({"nnodes": 2, "min_nnodes": 1}, r"--nnodes 1:2 needs --rdzv-endpoint HOST:PORT"),
    ({"nnodes": 1, "min_nnodes": 2, "rdzv_endpoint": "h:1"},
     r"--nnodes 2:1: the minimum is above the maximum"),
    ({"nnodes": 2, "min_nnodes": 0, "rdzv_endpoint": "h:1"}, "min_nnodes must be >= 1"),
    ({"nnodes": 2, "rdzv_endpoint": "h"}, r"--rdzv-endpoint must be 'host:port'.*'h'"),
    ({"nnodes": 2, "rdzv_endpoint": "h:1", "coordinator": "h:2"}, "drop --coordinator"),
    ({"nnodes": 2, "rdzv_endpoint": "h:1", "node_rank": 1}, "drop --node-rank"),
    ({"nnodes": 2, "rdzv_endpoint": "h:1", "rdzv_heartbeat_timeout": 0},
     "rdzv_heartbeat_timeout must be > 0 seconds"),
    ({"nproc_per_node": 2, "min_nproc_per_node": 1, "rdzv_endpoint": "h:1"},
     "make the nodes elastic instead"),
])
def test_bad_elastic_node_settings_name_the_value_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LaunchConfig(**kwargs)


def test_an_elastic_launch_without_the_token_is_refused(monkeypatch):
    monkeypatch.delenv("STRATAX_PS_TOKEN", raising=False)
    monkeypatch.delenv("STRATAX_PS_TOKEN_FILE", raising=False)
    with pytest.raises(ValueError, match=r"set STRATAX_PS_TOKEN=<secret>.*on every node"):
        launch([sys.executable, "-c", "pass"], nnodes=2, min_nnodes=1,
               rdzv_endpoint="127.0.0.1:1", stream_output=False)


def test_the_command_line_takes_nnodes_min_max(run_cli):
    from stratax._src.launch.arguments import build_parser

    args = build_parser().parse_args(["--nnodes", "1:3", "--rdzv-endpoint", "h:1", "t.py"])
    assert (args.min_nnodes, args.nnodes, args.rdzv_endpoint) == (1, 3, "h:1")
    proc = run_cli("--nnodes", "2:x", "t.py")
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 2 and "--nnodes must be N or MIN:MAX" in stderr, stderr


@pytest.mark.timeout(60)
def test_an_agent_whose_store_host_goes_stops_its_workers_with_an_error(scripts, run_cli,
                                                                        monkeypatch):
    """Two launchers on loopback form a round of 2 nodes; the store's host (its launcher and
    worker) is killed -9: the other stops its worker and raises an error naming the store
    after the heartbeat timeout, not a hang."""
    monkeypatch.setenv("STRATAX_PS_TOKEN", "the token")
    script = scripts.write("sleeper.py", """
        record_pid(f"worker_{RANK}")
        time.sleep(60)
    """)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{probe.getsockname()[1]}"
    host = run_cli("--nnodes", "1:2", "--rdzv-endpoint", endpoint, "--rdzv-last-call", "10",
                   script)
    assert "hosts the rendezvous store" in host.stderr.readline()
    errors = []

    def other_node():
        try:
            launch([sys.executable, script], nnodes=2, min_nnodes=1, rdzv_endpoint=endpoint,
                   rdzv_heartbeat_timeout=2.0, grace_period=0.5, stream_output=False)
        except LaunchError as err:
            errors.append(err)

    node = threading.Thread(target=other_node)
    node.start()
    worker = scripts.pid("worker_1")  # the round of 2 nodes runs
    for pid in (host.pid, scripts.pid("worker_0")):
        os.killpg(pid, signal.SIGKILL)
    started = time.monotonic()
    node.join(20)
    assert not node.is_alive() and len(errors) == 1, errors
    assert f"Cannot reach the rendezvous store at {endpoint}" in str(errors[0])
    assert "single point" in str(errors[0])
    assert time.monotonic() - started < 10
    assert scripts.wait_gone(worker)
