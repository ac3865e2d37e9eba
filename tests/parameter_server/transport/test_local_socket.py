"""The same-host transport: frames over the server's Unix socket, its errors, reconnects after
a restart, who may connect, and the switch back to gRPC."""

import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import numpy as np
import pytest
from as_nobody import send_as_nobody

from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.transport import local_socket, rpc, wire
from stratax._src.parameter_server.transport.rpc_server import RpcServer


@pytest.fixture
def client(echo_server):
    client = rpc.RpcClient("ps 0", f"127.0.0.1:{echo_server.port}", timeout=10)
    yield client
    client.close()


def test_frames_round_trip_over_the_socket():
    server = RpcServer("ps 0", "127.0.0.1", 0, ParameterServer().handle, max_workers=2)
    server.start()
    client = rpc.RpcClient("ps 0", f"127.0.0.1:{server.port}", timeout=20)
    directory = server.local.directory
    try:
        assert os.stat(directory).st_mode & 0o777 == 0o700
        table = np.random.default_rng(0).normal(size=(3 * rpc.CHUNK_BYTES // 256, 64))
        table = table.astype(np.float32)                      # 12 MiB: over gRPC's chunk size
        client.call("create", {"names": ["t", "b"]}, [table, np.arange(3, dtype=np.int64)])
        assert client.transport == "unix"
        got = client.call("pull", {"names": ["t", "b"]}).tensors
        np.testing.assert_array_equal(got[0], table)
        np.testing.assert_array_equal(got[1], [0, 1, 2])
        assert client.call("ping").meta["ok"]
    finally:
        client.close()
        server.stop(0)
    assert not os.path.exists(directory)
    server.stop(0)  # a second stop does nothing


def test_server_error_is_a_remote_error_and_the_connection_stays(client):
    with pytest.raises(rpc.RemoteError, match=r"ps 0 at 127\.0\.0\.1:\d+: boom failed: "
                                              r"KeyError: \"no such variable 'w'\""):
        client.call("boom", {"fail": True})
    assert client.transport == "unix"
    assert client.call("echo", {"x": 7}).meta["x"] == 7


def test_timeout_drops_the_connection_so_no_late_reply_is_read(echo_handler):
    """The call gives up while the server still holds its reply (no clock is asserted: the
    order of events is the promise)."""
    held, released, replied = threading.Event(), threading.Event(), threading.Event()

    def handler(frame: wire.Frame) -> bytes:
        if not frame.meta.get("hold"):
            return echo_handler(frame)
        held.set()
        released.wait(timeout=30)
        try:
            return echo_handler(frame)
        finally:
            replied.set()

    server = RpcServer("ps 0", "127.0.0.1", 0, handler, max_workers=2)
    server.start()
    client = rpc.RpcClient("ps 0", f"127.0.0.1:{server.port}", timeout=10)
    try:
        assert client.call("echo", {"x": 0}).meta["x"] == 0
        with pytest.raises(WorkerUnavailableError,
                           match=r"ps 0 at 127\.0\.0\.1:\d+ did not answer 'echo' within 0\.3 s"):
            client.call("echo", {"x": 1, "hold": True}, timeout=0.3)
        assert held.is_set() and not replied.is_set()   # it gave up before the reply was sent
        # The late reply (x=1) arrives on the dropped connection, never as a later answer.
        assert client.call("echo", {"x": 2}).meta["x"] == 2
        released.set()
        assert replied.wait(timeout=30)
        time.sleep(0.2)
        assert client.call("echo", {"x": 3}).meta["x"] == 3
        assert client.transport == "unix"
    finally:
        released.set()
        client.close()
        server.stop(0)


def test_an_oversized_frame_closes_that_connection_only(echo_server, client, caplog):
    assert client.call("echo", {"x": 1}).meta["x"] == 1
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(5)
        raw.connect(echo_server.local.path)
        raw.sendall((wire.MAX_FRAME_BYTES + 1).to_bytes(8, "little"))
        reply = local_socket.recv_frame(raw, time.monotonic() + 5, "ps 0")  # answered ...
        assert raw.recv(8) == b""                       # ... then closed, nothing allocated
    meta = wire.decode(reply).meta
    assert meta["ok"] is False and meta["kind"] == "wire", meta
    assert f"announced a frame of {wire.MAX_FRAME_BYTES + 1} bytes, over this task's limit" in (
        meta["error"])
    assert client.call("echo", {"x": 2}).meta["x"] == 2


def test_concurrent_calls_from_threads_get_their_own_replies(client):
    results = {}

    def call(x):
        tensor = np.full(100_000, x, np.float32)
        reply = client.call("echo", {"x": x, "sleep": 0.2}, [tensor])
        results[x] = (reply.meta["x"], float(reply.tensors[0].mean()))

    threads = [threading.Thread(target=call, args=(x,)) for x in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == {x: (x, float(x)) for x in range(4)}


_SERVE = textwrap.dedent("""
    import sys, time
    from stratax._src.parameter_server.transport import rpc_server
    from stratax._src.parameter_server.tasks.ps import ParameterServer
    server = rpc_server.RpcServer("ps 0", "127.0.0.1", int(sys.argv[1]), ParameterServer().handle)
    server.start()
    print(server.port, server.local.path, flush=True)
    time.sleep(60)
""")


def _serve_in_child(port):
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(port)], stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline().split()
    if not line:
        proc.kill()
        proc.wait(5)
        pytest.fail("the server child did not start")
    return proc, int(line[0]), line[1]


def test_killed_server_is_named_within_the_timeout_then_a_restart_is_reached():
    proc, port, path = _serve_in_child(0)
    paths = [path]
    client = rpc.RpcClient("ps 0", f"127.0.0.1:{port}", timeout=3)
    try:
        client.call("create", {"names": ["w"]}, [np.ones(3, np.float32)])
        assert client.transport == "unix"
        proc.kill()
        proc.wait(5)
        for _ in range(2):  # the dead connection, then the gRPC question for a new socket
            start = time.monotonic()
            with pytest.raises(WorkerUnavailableError,
                               match=rf"ps 0 at 127\.0\.0\.1:{port} .*unreachable or died"):
                client.call("ping", timeout=2)
            assert time.monotonic() - start < 2.5
        assert client.transport == "grpc"
        proc, _, new_path = _serve_in_child(port)
        paths.append(new_path)
        assert new_path != path
        assert not os.path.exists(os.path.dirname(path))  # a dead server's: removed on start
        client.wait_ready(10)   # gRPC's reconnect backoff, as a restarting ps' callers retry
        assert client.transport == "unix"
        with pytest.raises(rpc.RemoteError, match="'w'"):   # the new ps, not the old one
            client.call("pull", {"names": ["w"]})
        # Restarted between two calls: the idle connection to the dead one is dropped and the
        # call goes to the new socket (as a gRPC channel reconnects), with no error.
        proc.kill()
        proc.wait(5)
        proc, _, third_path = _serve_in_child(port)
        paths.append(third_path)
        client.wait_ready(10)
        assert client.transport == "unix" and third_path not in (path, new_path)
    finally:
        client.close()
        proc.kill()
        proc.wait(5)
        for killed in paths:
            shutil.rmtree(os.path.dirname(killed), ignore_errors=True)


def test_an_endpoint_that_fails_a_check_keeps_the_calls_off_the_socket(monkeypatch,
                                                                        echo_handler):
    """With a token the calls then go to the sealed port, and without one offered, over gRPC."""
    server = RpcServer("ps 0", "127.0.0.1", 0, echo_handler, token="s3cret", max_workers=2)
    server.start()
    real = server.local.endpoint()
    try:
        for sealed_port in (True, False):
            if not sealed_port:
                monkeypatch.setattr(server, "sealed", None)
            for lie in ({**real, "host": "elsewhere/other"}, {**real, "pid": real["pid"] + 1},
                        {**real, "uid": real["uid"] + 1}, {**real, "path": "/etc/passwd"},
                        {**real, "path": None}):
                monkeypatch.setattr(server.local, "endpoint", lambda lie=lie: dict(lie))
                client = rpc.RpcClient("ps 0", f"127.0.0.1:{server.port}", timeout=5,
                                       token="s3cret")
                try:
                    assert client.call("echo", {"x": 5}).meta["x"] == 5
                    assert client.transport == ("tcp" if sealed_port else "grpc"), lie
                finally:
                    client.close()
    finally:
        server.stop(0)


def test_without_a_token_no_call_goes_over_grpc(echo_server, monkeypatch):
    address = f"127.0.0.1:{echo_server.port}"
    # The server refuses it (a raw call, as any local process can make it) ...
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as err:
        channel.unary_unary("/stratax.Service/Call")(wire.encode({"method": "echo"}),
                                                     timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert re.search(r"ps 0 takes gRPC calls only with the cluster's shared token.*local socket "
                     r"is trusted \(processes of uid \d+ on its host\).*STRATAX_PS_TOKEN=<secret>",
                     err.value.details()), err.value.details()
    # ... and a client without a token never sends one: whoever listens at the port (a
    # squatter) gets no request.
    sent = []
    elsewhere = {**echo_server.local.endpoint(), "host": "elsewhere/other"}
    for transport, why in (("grpc", "transport 'grpc'"), ("auto", "the server is on another")):
        client = rpc.RpcClient("ps 0", address, timeout=5, transport=transport)
        if transport == "auto":
            monkeypatch.setattr(echo_server.local, "endpoint", lambda: elsewhere)
        monkeypatch.setattr(client, "_grpc_call", lambda *a: sent.append(a))
        try:
            with pytest.raises(rpc.RemoteError, match=rf"ps 0 at 127\.0\.0\.1:\d+: no trusted "
                               rf"way to call it: its local socket is not usable \({why}.*\) and "
                               r"no token is set here for gRPC; set the same STRATAX_PS_TOKEN"):
                client.call("echo", {"x": 1})
        finally:
            client.close()
    assert sent == []


def test_the_grpc_switch(monkeypatch, echo_handler):
    monkeypatch.setenv("STRATAX_PS_TRANSPORT", "grpc")
    monkeypatch.delenv("STRATAX_PS_TOKEN", raising=False)
    monkeypatch.delenv("STRATAX_PS_TOKEN_FILE", raising=False)
    with pytest.raises(ValueError, match=r"ps 0 would take no calls: without a shared token only "
                                         r"its local socket is trusted, and it has none "
                                         r"\(STRATAX_PS_TRANSPORT=grpc\); set STRATAX_PS_TOKEN"):
        RpcServer("ps 0", "127.0.0.1", 0, echo_handler, max_workers=2)
    server = RpcServer("ps 0", "127.0.0.1", 0, echo_handler, token="s3cret", max_workers=2)
    assert server.local is None
    server.start()
    try:
        monkeypatch.setenv("STRATAX_PS_TRANSPORT", "auto")
        client = rpc.RpcClient("ps 0", f"127.0.0.1:{server.port}", timeout=5, token="s3cret",
                               transport="grpc")
        try:
            assert client.call("echo", {"x": 1}).meta["x"] == 1
            assert client.transport == "grpc"
        finally:
            client.close()
    finally:
        server.stop(0)
    monkeypatch.setenv("STRATAX_PS_TRANSPORT", "unix")
    with pytest.raises(ValueError, match=r"STRATAX_PS_TRANSPORT='unix'.*'auto'.*'grpc'"):
        rpc.RpcClient("ps 0", "127.0.0.1:1")


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another uid needs root")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the child only makes socket calls
def test_a_process_of_another_uid_is_refused(echo_server, caplog):
    nobody = pwd.getpwnam("nobody").pw_uid
    path = echo_server.local.path
    request = wire.encode({"method": "echo", "x": 1})

    assert send_as_nobody(path, request) == 3  # the private directory stops it
    os.chmod(echo_server.local.directory, 0o755)          # past the file system: the uid check
    os.chmod(path, 0o777)
    assert send_as_nobody(path, request) == 0
    assert "refused a local connection from pid" in caplog.text
    assert f"running as uid {nobody}" in caplog.text


def test_transport_mode():
    assert [local_socket.transport_mode(m) for m in ("grpc", "tcp")] == ["grpc", "tcp"]
    with pytest.raises(ValueError, match=r"transport='udp' is not a parameter-server transport; "
                                         r"use 'auto' .* 'tcp' \(sealed TCP to every server\)"):
        local_socket.transport_mode("udp")
