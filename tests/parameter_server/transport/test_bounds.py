"""Bounded everything (issue 48 item 2), tried as an attacker would: a served ps task of a
claimed chief, and clients that announce huge frames, stop half-way, never speak, flood it
with connections or with unauthenticated gRPC calls, or send shapes numpy cannot build.
After each, the task's memory and threads are back within bounds and it still serves its
chief.

The attacks of the issue: a local frame announcing 2 GiB made the ps allocate it (RSS 251 ->
3,336 MB after two connections); 300 half-open local connections held 320 threads with no
read timeout; a shape ``[0, 2^31, 2^31, 2^31]`` escaped the parser as a plain ``ValueError``.
"""

import json
import socket
import struct
import threading
import time

import grpc
import numpy as np
import pytest
from cluster_helpers import cluster_addresses

import stratax as sx
from stratax._src.parameter_server.tasks.ownership import ChiefSession
from stratax._src.parameter_server.transport import (
    frame_listener,
    local_socket,
    rpc,
    rpc_server,
    shared_frames,
    wire,
)

pytestmark = pytest.mark.timeout(120)

_CAP = 12


def _rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _until(condition, seconds):
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.05)
    return condition()


def _start_ps():
    """An ``sx.Server`` ps task and its chief's client (claimed, holding a variable)."""
    spec = cluster_addresses({"ps": 1, "worker": 1})
    server = sx.Server(spec, job_name="ps", task_index=0, chief_timeout_seconds=60)
    chief = rpc.RpcClient("ps 0", spec["ps"][0], timeout=10)
    try:
        ChiefSession([chief], timeout=10).claim()
        chief.call("create", {"names": ["w"]}, [np.arange(4, dtype=np.float32)])
        assert chief.transport == "unix"
    except BaseException:
        chief.close()
        server.stop()
        raise
    return server, chief


@pytest.fixture
def served_ps(monkeypatch):
    """A ps task (``_start_ps``) with short read deadlines and a cap of ``_CAP``
    connections."""
    monkeypatch.setenv("STRATAX_PS_MAX_CONNECTIONS", str(_CAP))
    monkeypatch.setattr(frame_listener, "FIRST_SECONDS", 1.0)
    monkeypatch.setattr(frame_listener, "STALL_SECONDS", 1.0)
    monkeypatch.setattr(rpc_server, "_HANDSHAKE_MS", 1000)
    server, chief = _start_ps()
    yield server, chief
    chief.close()
    server.stop()


def _serves(chief):
    """The task still serves its chief: the variable it created, unchanged."""
    got = chief.call("pull", {"names": ["w"]}).tensors[0]
    np.testing.assert_array_equal(got, np.arange(4, dtype=np.float32))
    return True


def _connect(server):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(server._rpc.local.path)
    return sock


def test_huge_and_truncated_local_frames_cost_only_what_arrives(served_ps):
    server, chief = served_ps
    before = _rss_mib()
    stalled = []
    try:
        for _ in range(2):                    # the two connections announcing 2 GiB
            sock = _connect(server)
            sock.sendall(wire.MAX_FRAME_BYTES.to_bytes(8, "little") + bytes(1 << 20))
            stalled.append(sock)
        truncated = _connect(server)          # a frame cut short: the sender goes away
        frame = wire.encode({"method": "ping"})
        truncated.sendall(len(frame).to_bytes(8, "little") + frame[:5])
        truncated.close()
        time.sleep(0.3)
        assert _rss_mib() - before < 100, (before, _rss_mib())   # not the 4 GiB announced
        assert _serves(chief)
        for sock in stalled:                  # stopped mid-frame: dropped after the stall
            sock.settimeout(5)
            assert sock.recv(1) == b""
    finally:
        for sock in stalled:
            sock.close()
    assert _rss_mib() - before < 100
    assert _serves(chief)


def test_frames_over_the_setting_are_answered_then_closed(monkeypatch):
    monkeypatch.setenv("STRATAX_PS_MAX_FRAME_MIB", "1")
    server, chief = _start_ps()
    try:
        for word in ((1 << 20) + 1, shared_frames.IN_BUFFER | 8, 1 << 62):
            with _connect(server) as sock:
                sock.sendall(word.to_bytes(8, "little"))
                reply = wire.decode(local_socket.recv_frame(sock, time.monotonic() + 5, "ps"))
                assert reply.meta["ok"] is False and reply.meta["kind"] == "wire", reply.meta
                assert "announced a frame of" in reply.meta["error"]
                assert sock.recv(1) == b""            # then closed: the stream is out of step
        big = np.zeros((1 << 20) // 4 + 1, np.float32)   # the chief is bound by it too
        with pytest.raises(rpc.RemoteError, match="over this task's limit of 1048576 bytes "
                                                  r"\(STRATAX_PS_MAX_FRAME_MIB=1\)"):
            chief.call("create", {"names": ["big"]}, [big])
        assert _serves(chief)
    finally:
        chief.close()
        server.stop()


def test_a_shape_numpy_cannot_build_is_the_wires_error_and_the_connection_lives(served_ps):
    server, chief = served_ps
    header = json.dumps({"meta": {"method": "ping"}, "tensors": [
        {"dtype": "float32", "shape": [0, 2 ** 31, 2 ** 31, 2 ** 31]}]}).encode()
    frame = struct.pack("<4sHI", wire.MAGIC, wire.VERSION, len(header)) + header
    with _connect(server) as sock:
        for _ in range(2):                    # answered, and the same connection goes on
            sock.sendall(len(frame).to_bytes(8, "little") + frame)
            reply = wire.decode(local_socket.recv_frame(sock, time.monotonic() + 5, "ps"))
            assert reply.meta["ok"] is False and reply.meta["kind"] == "wire", reply.meta
            assert "larger than the frame limit" in reply.meta["error"]
    with pytest.raises(wire.WireError, match="larger than the frame limit"):
        wire.decode(frame)
    assert _serves(chief)


def test_half_open_connections_are_capped_and_timed_out(served_ps):
    server, chief = served_ps
    threads = threading.active_count()
    flood = []
    try:
        for _ in range(60):                   # 60 clients that connect and never speak
            flood.append(_connect(server))
        time.sleep(0.3)
        assert threading.active_count() <= threads + _CAP, threading.active_count()
        assert _serves(chief)                 # its own connection was open before the flood
        # The first-bytes deadline closes every one of them, and their threads end.
        assert _until(lambda: threading.active_count() <= threads, 5.0), (
            threading.active_count(), threads)
        for sock in flood:
            sock.settimeout(5)
            assert sock.recv(1) == b""
    finally:
        for sock in flood:
            sock.close()
    assert _serves(chief)


def test_unauthenticated_grpc_calls_are_refused_before_their_bodies(served_ps):
    server, chief = served_ps
    before, threads = _rss_mib(), threading.active_count()
    body = b"SXPS" + bytes(rpc.CHUNK_BYTES + (2 << 20))   # over the gRPC message limit too
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_unary("/stratax.Service/Call")
        for _ in range(40):
            with pytest.raises(grpc.RpcError) as err:
                call(body, timeout=10)
            # Refused on its metadata, before gRPC read the body (which, read, would have
            # been refused as too large).
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()
        stream = channel.stream_stream("/stratax.Service/Stream")
        sent = []
        release = threading.Event()

        def chunks():                         # a stream that never finishes on its own
            for _ in range(100):
                sent.append(1)
                yield bytes(1 << 20)
                release.wait(0.1)

        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            list(stream(chunks(), timeout=20))
        release.set()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert time.monotonic() - start < 5 and len(sent) < 100
    assert _rss_mib() - before < 150, (before, _rss_mib())
    assert _until(lambda: threading.active_count() <= threads + 2, 5.0)
    assert _serves(chief)


def test_half_open_grpc_connections_are_closed_after_the_handshake_deadline(served_ps):
    server, chief = served_ps
    threads = threading.active_count()
    host, port = server.address.rsplit(":", 1)
    flood = [socket.create_connection((host, int(port)), timeout=5) for _ in range(30)]
    try:
        time.sleep(0.3)
        assert threading.active_count() <= threads + 1, threading.active_count()
        assert _serves(chief)
        for sock in flood:                    # no HTTP/2 preface ever sent: closed by gRPC
            end = time.monotonic() + 10
            while sock.recv(1 << 16) and time.monotonic() < end:
                pass
            assert time.monotonic() < end
    finally:
        for sock in flood:
            sock.close()
    assert _serves(chief)
