"""Shared memory under the local socket: frames that fit travel in it, larger ones over the
socket, replies never alias the buffer, and a buffer that is not a sealed memfd is refused."""

import os

import numpy as np
import pytest

from stratax._src.parameter_server.transport import rpc, shared_frames

pytestmark = pytest.mark.skipif(not shared_frames.SUPPORTED, reason="needs memfd and SCM_RIGHTS")


@pytest.fixture
def shared_writes(monkeypatch):
    """Lengths of the frames written into shared buffers (both ends run in this process)."""
    written = []
    write = shared_frames.SharedFrames.write

    def spy(self, half, parts):
        length = write(self, half, parts)
        if length is not None:
            written.append((half, length))
        return length

    monkeypatch.setattr(shared_frames.SharedFrames, "write", spy)
    return written


def test_small_frames_travel_in_shared_memory_and_replies_do_not_alias_it(echo_server,
                                                                         shared_writes):
    client = rpc.RpcClient("ps 0", f"127.0.0.1:{echo_server.port}", timeout=10)
    try:
        first = client.call("echo", {"x": 1}, [np.full((784, 128), 1.0, np.float32)])
        second = client.call("echo", {"x": 2}, [np.full((784, 128), 2.0, np.float32)])
        assert client.transport == "unix"
        assert [half for half, _ in shared_writes] == [0, 1, 0, 1]  # request, reply, twice
        assert first.meta["x"] == 1 and second.meta["x"] == 2
        assert (first.tensors[0] == 1.0).all() and (second.tensors[0] == 2.0).all()
        shared_writes.clear()
        big = np.arange(shared_frames.HALF_BYTES // 4 + 16, dtype=np.float32)  # over a half
        np.testing.assert_array_equal(client.call("echo", {}, [big]).tensors[0], big)
        assert shared_writes == []  # both ways over the socket
        np.testing.assert_array_equal(client.call("echo", {}, [big[:8]]).tensors[0], big[:8])
        assert len(shared_writes) == 2  # the connection still has its buffer
    finally:
        client.close()


def test_socket_transport_keeps_frames_on_the_socket(echo_server, shared_writes):
    client = rpc.RpcClient("ps 0", f"127.0.0.1:{echo_server.port}", timeout=10, transport="socket")
    try:
        reply = client.call("echo", {"x": 3}, [np.ones(10, np.float32)])
        assert client.transport == "unix" and reply.meta["x"] == 3
        assert shared_writes == []
    finally:
        client.close()


def test_a_buffer_that_can_be_resized_is_refused():
    fd = os.memfd_create("not-sealed", os.MFD_CLOEXEC)
    os.ftruncate(fd, 2 * shared_frames.HALF_BYTES)
    with pytest.raises(ValueError, match="sealed against resizing"):
        shared_frames.SharedFrames.adopt(fd)  # closes fd
    frames, fd = shared_frames.SharedFrames.create()
    try:
        with pytest.raises(ConnectionError, match="announced in a"):
            frames.read(0, shared_frames.HALF_BYTES + 1)
        assert frames.write(1, [b"abc", memoryview(b"de")]) == 5
        assert frames.read(1, 5) == bytearray(b"abcde")
    finally:
        os.close(fd)
        frames.close()
