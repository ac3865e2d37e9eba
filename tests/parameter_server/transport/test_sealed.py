"""The transport between hosts (``sealed``): the local socket's frames over TCP, sealed with
AES-GCM under keys from a ``Ticket`` call over the cluster's mutual TLS.

Tried as an attacker on the network would: a relay that records, alters, reflects or replays
the bytes, an impostor at the sealed port, clients without a ticket or with a used one, and
clients that never speak. The cluster's token, the chief's session and the frames' contents
never cross in clear, and whatever is altered fails authentication.
"""

import contextlib
import os
import socket
import threading
import time

import numpy as np
import pytest

from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.transport import (
    frame_listener,
    rpc,
    rpc_server,
    sealed,
    wire,
)

pytestmark = pytest.mark.timeout(60)

_TOKEN = "sealed-cluster-key-" + "5" * 32
_MARK = b"PLAINTEXT-MARKER-" * 64  # a tensor's bytes, easy to find on the wire


def _echo(frame: wire.Frame) -> bytes:
    return rpc.response({"x": frame.meta.get("x")}, frame.tensors)


@pytest.fixture
def server():
    server = rpc_server.RpcServer("ps 0", "127.0.0.1", 0, _echo, token=_TOKEN, max_workers=2)
    server.start()
    yield server
    server.stop(0)


def _client(server, timeout=5.0):
    return rpc.RpcClient("ps 0", f"127.0.0.1:{server.port}", timeout=timeout, token=_TOKEN,
                         transport="tcp")


class _Relay:
    """A TCP relay in front of ``port`` that records what passes each way, and may change
    it: ``alter[direction](bytes) -> bytes`` (direction ``"up"``: client to server)."""

    def __init__(self, port: int, alter=None) -> None:
        self.seen = {"up": bytearray(), "down": bytearray()}
        self._alter = alter or {}
        self._target = port
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()
        self._open: list[socket.socket] = []

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(("127.0.0.1", self._target), timeout=5)
            self._open += [client, upstream]
            for source, sink, direction in ((client, upstream, "up"),
                                            (upstream, client, "down")):
                thread = threading.Thread(target=self._pump, args=(source, sink, direction),
                                          daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source, sink, direction) -> None:
        source.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = source.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            self.seen[direction] += data
            data = self._alter.get(direction, lambda b: b)(data)
            try:
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        for sock in (self._sock, *self._open):
            sock.close()


@pytest.fixture
def relayed(monkeypatch, server):
    """``server``, a relay in front of its sealed port, and a function that makes a client
    whose sealed connections go through the relay."""
    relays = []

    def make(alter=None):
        relay = _Relay(server.sealed.port, alter)
        relays.append(relay)
        client = _client(server)
        real_framed = client._framed
        monkeypatch.setattr(client, "_framed", lambda endpoint, deadline: real_framed(
            {**endpoint, "sealed_port": relay.port}, deadline))
        return relay, client

    yield make
    for relay in relays:
        relay.close()


def test_frames_of_every_size_round_trip_sealed(server):
    client = _client(server)
    try:
        sizes = [0, 1, sealed.RECORD_BYTES - 7, sealed.RECORD_BYTES, 3 * sealed.RECORD_BYTES + 5]
        tensors = [np.random.default_rng(n).integers(0, 255, n).astype(np.uint8) for n in sizes]
        reply = client.call("echo", {"x": 3}, tensors)
        assert client.transport == "tcp" and reply.meta["x"] == 3
        for sent, got in zip(tensors, reply.tensors, strict=True):
            np.testing.assert_array_equal(got, sent)
        results = {}

        def call(i):
            results[i] = client.call("echo", {"x": i}, [np.full(50_000 + i, i, np.int32)])

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        for i in range(6):                  # each thread got its own reply
            assert results[i].meta["x"] == i
            np.testing.assert_array_equal(results[i].tensors[0], np.full(50_000 + i, i, np.int32))
    finally:
        client.close()


def test_nothing_crosses_in_clear(relayed):
    relay, client = relayed()
    try:
        client.session = "chief-session-" + "9" * 24
        tensor = np.frombuffer(_MARK, np.uint8)
        reply = client.call("echo", {"x": "a request in clear?"}, [tensor])
        np.testing.assert_array_equal(reply.tensors[0], tensor)
        assert client.transport == "tcp"
    finally:
        client.close()
    up, down = bytes(relay.seen["up"]), bytes(relay.seen["down"])
    assert len(up) > len(_MARK) and len(down) > len(_MARK)
    for secret in (_MARK[:32], _TOKEN.encode(), client.session.encode(), b"a request in clear?",
                   b"method", wire.MAGIC):
        assert secret not in up and secret not in down, secret


def _closed_by_peer(sock: socket.socket, send: bytes = b"") -> bool:
    """Whether the server closed ``sock`` (after ``send``, if it gets that far): an end of
    stream, or a reset where it closed with bytes unread."""
    sock.settimeout(5)
    try:
        if send:
            sock.sendall(send)
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def _flip_last(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


@pytest.mark.parametrize("direction", ["up", "down"])
def test_an_altered_byte_fails_authentication_and_the_call_fails(relayed, server, direction):
    relay, client = relayed({direction: _flip_last})
    try:
        with pytest.raises(WorkerUnavailableError, match=r"ps 0 at 127\.0\.0\.1:\d+ failed "
                           r"'echo'") as err:
            client.call("echo", {"x": 1}, [np.ones(1000, np.float32)])
        if direction == "down":                 # the client opened it, and says why
            assert "failed authentication: it was altered on the way" in str(err.value)
    finally:
        client.close()
    assert relay.seen["up"]                     # the call went through the relay
    direct = _client(server)                    # the server goes on serving
    try:
        assert direct.call("echo", {"x": 2}).meta["x"] == 2
    finally:
        direct.close()


def test_reflected_or_replayed_records_fail_authentication(server):
    """A relay that sends the client its own sealed request back (reflection), and a replay of
    a recorded session to the server under a used ticket, are both refused."""
    client = _client(server)
    try:
        client.call("echo", {"x": 1})            # the first connection, keyed by a ticket
        ticket = client._ticket(time.monotonic() + 5)
        sealer = sealed.Sealer(bytes.fromhex(ticket["to_server"]),
                               bytes.fromhex(ticket["to_client"]))
        with socket.create_connection(("127.0.0.1", server.sealed.port), timeout=5) as sock:
            sock.sendall(bytes.fromhex(ticket["id"]))
            sealer.send_frame(sock, wire.encode_parts({"method": "echo", "x": 7}, ()),
                              time.monotonic() + 5)
            reply = sealer.recv_frame(sock, time.monotonic() + 5, "ps 0", 1 << 20)
            assert wire.decode(reply).meta["x"] == 7
        # Reflection: the client's own request, sent back to it as a reply.
        a, b = socket.socketpair()
        with a, b:
            mine = sealed.Sealer(bytes.fromhex(ticket["to_server"]),
                                 bytes.fromhex(ticket["to_client"]))
            mine.send_frame(a, [b"request"], time.monotonic() + 5)
            with pytest.raises(sealed.SealBroken, match="failed authentication"):
                mine.recv_frame(b, time.monotonic() + 5, "the relay", 1 << 20)
        # Replay: the ticket is used; a connection presenting it again is closed unread.
        with socket.create_connection(("127.0.0.1", server.sealed.port), timeout=5) as sock:
            sealer2 = sealed.Sealer(bytes.fromhex(ticket["to_server"]),
                                    bytes.fromhex(ticket["to_client"]))
            a, b = socket.socketpair()               # the replayed request, sealed as before
            with a, b:
                sealer2.send_frame(a, wire.encode_parts({"method": "echo", "x": 8}, ()),
                                   time.monotonic() + 5)
                a.close()
                recorded = b.recv(1 << 16)
            assert _closed_by_peer(sock, bytes.fromhex(ticket["id"]) + recorded)
        assert client.call("echo", {"x": 9}).meta["x"] == 9
    finally:
        client.close()


def test_an_impostor_at_the_sealed_port_is_refused_and_learns_nothing(server, monkeypatch):
    """A listener at the port the client was told (a squatter on a dead task's port) gets the
    connection's id and sealed bytes, and whatever it answers fails authentication."""
    heard = bytearray()
    impostor = socket.create_server(("127.0.0.1", 0))
    impostor.settimeout(0.2)
    stop = threading.Event()

    def answer():
        """Answers each connection, once its request has come (the id and a sealed header at
        least), with zeros as a frame header and body."""
        while not stop.is_set():
            try:
                conn, _ = impostor.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                got = bytearray()
                while len(got) < sealed.ID_BYTES + 24:
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    got += data
                heard.extend(got)
                with contextlib.suppress(OSError):
                    conn.sendall(bytes(4096))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    client = _client(server)
    real_framed = client._framed
    monkeypatch.setattr(client, "_framed", lambda endpoint, deadline: real_framed(
        {**endpoint, "sealed_port": impostor.getsockname()[1]}, deadline))
    try:
        with pytest.raises(WorkerUnavailableError, match="failed authentication"):
            client.call("echo", {"x": 1}, [np.frombuffer(_MARK, np.uint8)])
    finally:
        client.close()
        stop.set()
        thread.join(5)
        impostor.close()
    assert len(heard) > sealed.ID_BYTES and _MARK[:32] not in heard and _TOKEN.encode() not in heard


def test_connections_without_a_ticket_are_closed_and_flooders_are_bounded(monkeypatch):
    monkeypatch.setenv("STRATAX_PS_MAX_CONNECTIONS", "8")
    monkeypatch.setattr(frame_listener, "FIRST_SECONDS", 1.0)
    server = rpc_server.RpcServer("ps 0", "127.0.0.1", 0, _echo, token=_TOKEN, max_workers=2)
    server.start()
    threads = threading.active_count()
    flood = []
    try:
        port = server.sealed.port
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            assert _closed_by_peer(sock, os.urandom(sealed.ID_BYTES) + bytes(1 << 20))
        for _ in range(40):                      # never speak: capped, then timed out
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.3)
        assert threading.active_count() <= threads + 8, threading.active_count()
        for sock in flood:
            assert _closed_by_peer(sock)
        end = time.monotonic() + 5
        while threading.active_count() > threads and time.monotonic() < end:
            time.sleep(0.05)
        assert threading.active_count() <= threads
        client = _client(server)
        try:
            assert client.call("echo", {"x": 4}).meta["x"] == 4
        finally:
            client.close()
    finally:
        for sock in flood:
            sock.close()
        server.stop(0)


def test_a_ticket_serves_one_connection_within_its_time(monkeypatch):
    tickets = sealed.Tickets()
    issued = bytes.fromhex(tickets.issue()["id"])
    assert tickets.take(issued) is not None
    assert tickets.take(issued) is None                      # used
    assert tickets.take(os.urandom(sealed.ID_BYTES)) is None  # never issued
    monkeypatch.setattr(sealed, "TICKET_SECONDS", -1.0)
    assert tickets.take(bytes.fromhex(tickets.issue()["id"])) is None  # expired


def test_a_frame_over_the_servers_limit_is_answered_then_closed(monkeypatch):
    monkeypatch.setenv("STRATAX_PS_MAX_FRAME_MIB", "1")
    server = rpc_server.RpcServer("ps 0", "127.0.0.1", 0, _echo, token=_TOKEN, max_workers=2)
    server.start()
    client = _client(server)
    try:
        with pytest.raises(rpc.RemoteError, match="over this task's limit of 1048576 bytes "
                                                  r"\(STRATAX_PS_MAX_FRAME_MIB=1\)"):
            client.call("echo", {}, [np.zeros((1 << 20) // 4 + 1, np.float32)])
        assert client.call("echo", {"x": 5}).meta["x"] == 5   # on a new connection
        assert client.transport == "tcp"
    finally:
        client.close()
        server.stop(0)


def test_a_key_is_retired_before_it_seals_too_much(server, monkeypatch):
    monkeypatch.setattr(sealed, "KEY_BYTES", 1 << 20)
    issued = []
    issue = server._tickets.issue
    monkeypatch.setattr(server._tickets, "issue", lambda: issued.append(1) or issue())
    client = _client(server)
    try:
        tensor = np.ones((300 << 10) // 4, np.float32)          # 300 KiB each way per call
        for _ in range(8):                                      # a new key every 2 calls
            np.testing.assert_array_equal(client.call("echo", {}, [tensor]).tensors[0], tensor)
        assert len(issued) >= 4 and client.transport == "tcp"
    finally:
        client.close()
    sender = sealed.Sealer(os.urandom(16), os.urandom(16))     # and a sender never goes past
    sender.sent_bytes = sealed.KEY_BYTES - 10
    left, right = socket.socketpair()
    with left, right, pytest.raises(sealed.SealBroken, match="key is used up"):
        sender.send_frame(left, [bytes(100)], time.monotonic() + 5)


def test_an_unreachable_sealed_port_keeps_the_calls_on_grpc(server, monkeypatch):
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()                               # nothing listens there now
    client = _client(server)
    real_framed = client._framed
    monkeypatch.setattr(client, "_framed", lambda endpoint, deadline: real_framed(
        {**endpoint, "sealed_port": port}, deadline))
    try:
        assert client.call("echo", {"x": 6}).meta["x"] == 6
        assert client.transport == "grpc"
    finally:
        client.close()


def _fit_weights(monkeypatch, transport):
    """Keras ``fit`` of an embedding model on 2 ps and a worker (threads of this process)
    with every call on ``transport``; its weights."""
    import keras
    from cluster_helpers import local_servers

    monkeypatch.setenv("STRATAX_PS_TOKEN", _TOKEN)
    monkeypatch.setenv("STRATAX_PS_TRANSPORT", transport)
    keras.utils.set_random_seed(3)
    with local_servers(ps=2, workers=1) as make:
        strategy = make()
        with strategy.scope():
            model = keras.Sequential([
                keras.Input((3,), dtype="int32"), keras.layers.Embedding(1000, 8),
                keras.layers.Flatten(), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        x = np.random.default_rng(0).integers(0, 1000, (64, 3)).astype("int32")
        model.fit(x, np.ones((64, 1), "float32"), batch_size=16, epochs=2, shuffle=False,
                  verbose=0)
        return [np.asarray(w) for w in model.get_weights()]


def test_keras_fit_over_sealed_tcp_equals_the_local_socket(monkeypatch, caplog):
    with caplog.at_level("INFO", logger="stratax._src.parameter_server.transport.rpc"):
        sealed_weights = _fit_weights(monkeypatch, "tcp")
    routes = [r.getMessage() for r in caplog.records if "calls go over" in r.getMessage()]
    assert routes and all("(sealed TCP)" in route for route in routes), routes
    assert {"ps 0", "ps 1", "worker 0"} <= {route.split(" at ")[0] for route in routes}
    for got, want in zip(sealed_weights, _fit_weights(monkeypatch, "auto"), strict=True):
        np.testing.assert_array_equal(got, want)
