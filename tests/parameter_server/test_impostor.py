"""An impostor at a task's address (issue 48 item 1): a ps task of a cluster with a token is
killed, and another process listens on its port before it comes back (the issue's attack:
another user binds the port of a task that died; the chief's and the workers' next calls
used to bring it the cluster's token in clear gRPC metadata).

The impostor is first a raw TCP listener that records every byte the cluster's client sends,
then a gRPC server of another key (one that would serve whatever reached it). Asserted: the
bytes carry neither the token nor the chief's session nor any request (no HTTP/2 in clear, no
frame), the client refuses the impostor, and it reaches the real task once it is back. Over
gRPC, over the same-host socket (found over TLS) and over the sealed TCP port (whose
connections need a ticket from a TLS call first).
"""

import socket
import threading
import time

import numpy as np
import pytest
from cluster_helpers import cluster_addresses

import stratax as sx
from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.tasks.ownership import ChiefSession
from stratax._src.parameter_server.transport import rpc, rpc_server, wire

pytestmark = pytest.mark.timeout(120)

_TOKEN = "the-cluster-key-" + "7" * 32


class _Recorder:
    """A raw TCP listener on ``port`` that keeps every byte each connection sends it (for a
    second at most) and answers nothing."""

    def __init__(self, port: int) -> None:
        self.received = bytearray()
        self.connections = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(0.2)
                end = time.monotonic() + 1.0
                while time.monotonic() < end and not self._stop.is_set():
                    try:
                        data = conn.recv(1 << 16)
                    except TimeoutError:
                        continue
                    if not data:
                        break
                    self.received += data

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def _start_ps(spec):
    return sx.Server(spec, job_name="ps", task_index=0, chief_timeout_seconds=60)


@pytest.mark.parametrize("transport", ["grpc", "auto", "tcp"])
def test_an_impostor_on_a_dead_tasks_port_gets_nothing_and_is_refused(monkeypatch, transport):
    monkeypatch.setenv("STRATAX_PS_TOKEN", _TOKEN)
    spec = cluster_addresses({"ps": 1, "worker": 1})
    port = int(spec["ps"][0].rsplit(":", 1)[1])
    server = _start_ps(spec)
    chief = rpc.RpcClient("ps 0", spec["ps"][0], timeout=3, transport=transport)
    impostors = []
    try:
        session = ChiefSession([chief], timeout=10)
        session.claim()
        chief.call("create", {"names": ["w"]}, [np.arange(4, dtype=np.float32)])
        assert chief.transport == {"grpc": "grpc", "auto": "unix", "tcp": "tcp"}[transport]
        server.stop()                                  # the task dies; its port is free

        recorder = _Recorder(port)
        impostors.append(recorder)
        with pytest.raises(WorkerUnavailableError, match=r"ps 0 at 127\.0\.0\.1:\d+"):
            chief.call("pull", {"names": ["w"]})
        for _ in range(2):                              # the heartbeat's next tries, too
            with pytest.raises(WorkerUnavailableError):
                chief.call("session", {"session": session.id, "timeout_s": 3}, timeout=1.5)
        recorder.close()
        heard = bytes(recorder.received)
        assert recorder.connections and heard, "the client never reached the impostor"
        assert heard[:1] == b"\x16", heard[:16]         # a TLS handshake record, and only that
        for secret in (_TOKEN, session.id, session.id.rsplit("-", 1)[1]):
            assert secret.encode() not in heard
        assert b"PRI * HTTP/2.0" not in heard and wire.MAGIC not in heard

        # An impostor that speaks gRPC, with a key of its own, would serve any call.
        served = []
        fake = rpc_server.RpcServer("ps 0", "127.0.0.1", port,
                                    lambda frame: served.append(frame) or rpc.response(),
                                    token="impostor-key-" + "1" * 32, max_workers=2)
        fake.start()
        impostors[0] = fake
        # Until its reconnect back-off lets it try the new listener, the channel may answer
        # with its last failure (the recorder that hung up): ask again until it has tried.
        deadline = time.monotonic() + 10
        while True:
            with pytest.raises(WorkerUnavailableError) as refused:
                chief.call("pull", {"names": ["w"]})
            if "handshake" in str(refused.value) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "the TLS handshake failed, so it does not hold this cluster's key" in str(
            refused.value), refused.value
        assert served == []
        fake.stop(0)
        impostors.clear()

        server = _start_ps(spec)                        # the real task is back
        chief.wait_ready(10)
        session.refresh(chief, timeout=10)
        assert chief.call("ping").meta["ok"]
    finally:
        for impostor in impostors:
            impostor.close() if isinstance(impostor, _Recorder) else impostor.stop(0)
        chief.close()
        server.stop()
