"""10,000 malformed frames against a live parameter server: no crash, no hang, no state change.

A ``ParameterServer`` is served by a real ``RpcServer`` (gRPC on 127.0.0.1) holding a dense and
a row-sparse variable with optimizers and a ledger. Each case mutates a valid request (truncated,
bytes flipped, random bytes, wrong version, bad header length, wrong dtypes and shapes,
oversized lengths, bad metadata, trailing or missing payload); every ``GRPC_EVERY``-th case is
sent over gRPC, the next one over the server's local socket (one connection, length-prefixed
frames: the socket's framing keeps in step after every malformed frame), the next over its
sealed TCP port (one connection, keyed by a ticket: likewise in step), the others go
straight to the running server's dispatch (what both transports call once the call is
authorised), which keeps the test within seconds. Every
reply must be a well-formed frame; a rejected frame must leave the server exactly as it was:
a reference server is fed only the frames the live one accepted (a mutation can keep a request
valid, e.g. a changed step id), and the two are compared (values, optimizer iterations, ledger,
pending synchronous steps) every 500 cases and at the end. Errors other than ``KeyError``,
``ValueError`` and ``RuntimeError`` (the server's own refusals) count as crashes.
"""

import json
import socket
import struct
import time

import grpc
import numpy as np
import pytest

from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.transport import cluster_tls, local_socket, rpc, sealed, wire
from stratax._src.parameter_server.transport.rpc_server import RpcServer

pytestmark = pytest.mark.timeout(120)

CASES = 10_000
GRPC_EVERY = 4
_PREFIX = struct.Struct("<4sHI")
_REFUSALS = ("KeyError:", "ValueError:", "RuntimeError:")
_BAD_DTYPES = ["object", "float128", "complex64", "<f4", "", "float32 ", "int4", "str", 5, None,
               ["float32"], "int32", "float64", "uint8", "bool", "float16", "int64"]
_BAD_SHAPES = [[-1], [3, -2], [1.5], [True], ["3"], [[3]], [1] * 9, [2 ** 40], [2 ** 31, 2 ** 31],
               [0, 2 ** 31, 2 ** 31, 2 ** 31],
               [], [0], [6], [2, 3], [3, 2, 1], [1 << 20, 1 << 20], None, 3, {"a": 1}]
_BAD_VALUES = [None, True, -1, 0, 1, 2 ** 70, 1.5, "", "x" * 300, [], ["v", "v"], ["nope"],
               ["v", 3], {"k": "v"}, "v", "t", ["t"], ["v"], 65537, "fuzz:0"]


def _setup(server):
    """The shared starting state: variables, optimizers and one applied step in the ledger."""
    def call(meta, tensors=()):
        reply = wire.decode(RpcServer._dispatch(_Dispatch(server), wire.encode(meta, tensors)))
        assert reply.meta["ok"], reply.meta

    call({"method": "create", "names": ["v", "t"]},
         [np.arange(6, dtype=np.float32).reshape(3, 2), np.ones((8, 2), np.float32)])
    call({"method": "set_optimizer", "names": ["v", "t"], "sparse_updates": "lazy",
          "spec": {"class_name": "SGD", "config": {"learning_rate": 0.5}}})
    call({"method": "push", "step": "seed:0", "dense": ["v"], "sparse": []},
         [np.ones((3, 2), np.float32)])


class _Dispatch:
    """What ``RpcServer._dispatch`` reads from its server, to feed the reference directly."""

    def __init__(self, server):
        self._handler = server.handle
        self.name = "reference ps"


def _state(server):
    """Everything a request could change, comparable with ``==`` (values as bytes)."""
    out = {"shutdown": server.shutdown_requested.is_set()}
    for name, shard in sorted(server._shards.items()):
        with shard.lock:
            out[name] = (shard.value.dtype.str, shard.value.shape, shard.value.tobytes(),
                         shard.optimizer.iterations if shard.optimizer else None,
                         shard.optimizer_key, sorted(shard.ledger), shard.duplicates,
                         sorted(shard.pending))
    return out


_BASES = [
    ({"method": "push", "step": "fuzz:1", "dense": ["v"], "sparse": []},
     [np.full((3, 2), 0.25, np.float32)]),
    ({"method": "push", "step": "fuzz:2", "dense": [], "sparse": ["t"]},
     [np.array([1, 5], np.int64), np.full((2, 2), 0.5, np.float32)]),
    ({"method": "push", "step": "fuzz:3", "dense": ["v"], "sparse": ["t"], "sync": 2,
      "worker": 1}, [np.ones((3, 2), np.float32), np.array([0], np.int32),
                     np.ones((1, 2), np.float32)]),
    ({"method": "pull", "names": ["v"], "row_names": ["t"]}, [np.array([0, 7], np.int64)]),
    ({"method": "assign", "names": ["v"]}, [np.full((3, 2), 2.0, np.float32)]),
    ({"method": "create", "names": ["v"]}, [np.zeros((3, 2), np.float32)]),
    ({"method": "stats", "names": ["v", "t"]}, []),
    ({"method": "ping"}, []),
]


def _with_header(frame, change):
    """``frame`` with its JSON header changed by ``change(header)`` (payload kept)."""
    _, version, length = _PREFIX.unpack_from(frame, 0)
    header = json.loads(frame[_PREFIX.size:_PREFIX.size + length])
    change(header)
    text = json.dumps(header).encode()
    return _PREFIX.pack(wire.MAGIC, version, len(text)) + text + frame[_PREFIX.size + length:]


def _mutate(case, rng):
    meta, tensors = _BASES[case % len(_BASES)]
    frame = wire.encode(meta, tensors)
    kind = (case // len(_BASES)) % 10
    pick = lambda items: items[int(rng.integers(len(items)))]  # noqa: E731
    if kind == 0:                                   # truncated
        return frame[:int(rng.integers(0, len(frame)))]
    if kind == 1:                                   # bytes flipped
        data = bytearray(frame)
        for _ in range(int(rng.integers(1, 5))):
            data[int(rng.integers(0, len(data)))] = int(rng.integers(0, 256))
        return bytes(data)
    if kind == 2:                                   # random bytes, half behind a valid prefix
        body = rng.bytes(int(rng.integers(0, 300)))
        if case % 2:
            body = _PREFIX.pack(wire.MAGIC, wire.VERSION, int(rng.integers(0, 400))) + body
        return body
    if kind == 3:                                   # wrong version
        version = int(rng.integers(0, 1 << 16))
        version += version == wire.VERSION
        return frame[:4] + struct.pack("<H", version) + frame[6:]
    if kind == 4:                                   # header length wrong or oversized
        length = pick([0, 1, len(frame), wire.MAX_HEADER_BYTES + 1, 2 ** 32 - 1,
                       int(rng.integers(0, 2 ** 32))])
        return frame[:6] + struct.pack("<I", length) + frame[10:]
    if kind == 5 and tensors:                       # wrong dtype
        def dtype(h):
            pick(h["tensors"])["dtype"] = pick(_BAD_DTYPES)
        return _with_header(frame, dtype)
    if kind == 6 and tensors:                       # wrong shape
        def shape(h):
            pick(h["tensors"])["shape"] = pick(_BAD_SHAPES)
        return _with_header(frame, shape)
    if kind == 7:                                   # oversized lengths in the header
        def huge(h):
            h["tensors"] = h["tensors"] or [{"dtype": "float32", "shape": [1]}]
            pick(h["tensors"])["shape"] = [int(rng.integers(1 << 20, 1 << 31)),
                                           int(rng.integers(1, 1 << 12))]
        return _with_header(frame, huge)
    if kind == 8:                                   # bad metadata values or keys
        def bad_meta(h):
            key = pick([*h["meta"], "method", "after", "wait_s", "extra"])
            h["meta"][key] = pick([*_BAD_VALUES, "pull", "push", "shutdownx", "stats"])
            if case % 5 == 0:
                h.pop(pick(["meta", "tensors"]))
        return _with_header(frame, bad_meta)
    cut = int(rng.integers(1, 9))                   # payload with bytes added or missing
    return frame + rng.bytes(cut) if case % 2 else frame[:-cut] if tensors else frame + b"\0"


_TOKEN = "fuzz-cluster-secret"


def _channel(address: str) -> grpc.Channel:
    """A gRPC channel of the cluster (TLS keyed by its token: a server takes no gRPC call
    without it), so the frames reach the parser."""
    return grpc.secure_channel(address, cluster_tls.channel_credentials(_TOKEN),
                               options=[("grpc.ssl_target_name_override",
                                         cluster_tls.TARGET_NAME)])


@pytest.fixture
def live_server():
    service = ParameterServer()
    _setup(service)
    server = RpcServer("ps 0", "127.0.0.1", 0, service.handle, token=_TOKEN, max_workers=2)
    server.start()
    channel = _channel(f"127.0.0.1:{server.port}")
    yield service, channel, server
    channel.close()
    server.stop(0)


def test_ten_thousand_malformed_frames_change_nothing(live_server):
    service, channel, server = live_server
    call = channel.unary_unary("/stratax.Service/Call")
    reference = ParameterServer()
    _setup(reference)
    rng = np.random.default_rng(2026)
    outcomes = {"accepted": 0, "malformed": 0, "refused": 0}
    start = time.monotonic()
    local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    local.connect(server.local.path)
    ticket = wire.decode(channel.unary_unary("/stratax.Service/Ticket")(b"", timeout=10)).meta
    remote = socket.create_connection(("127.0.0.1", server.sealed.port), timeout=10)
    remote.sendall(bytes.fromhex(ticket["id"]))
    sealer = sealed.Sealer(bytes.fromhex(ticket["to_server"]), bytes.fromhex(ticket["to_client"]))
    for case in range(CASES):
        data = _mutate(case, rng)
        if case % GRPC_EVERY == 0:
            reply = wire.decode(call(data, timeout=10))   # a deadline per call: no hang
        elif case % GRPC_EVERY == 1:
            local.sendall(len(data).to_bytes(8, "little") + data)
            reply = wire.decode(local_socket.recv_frame(local, time.monotonic() + 10, "ps"))
        elif case % GRPC_EVERY == 2:
            sealer.send_frame(remote, [data], time.monotonic() + 10)
            reply = wire.decode(sealer.recv_frame(remote, time.monotonic() + 10, "ps", 1 << 30))
        else:
            reply = wire.decode(server._dispatch(data))
        if reply.meta["ok"]:
            outcomes["accepted"] += 1                  # a mutation that stayed a valid request
            again = wire.decode(RpcServer._dispatch(_Dispatch(reference), data))
            assert again.meta["ok"], again.meta
        elif reply.meta["kind"] == "wire":
            outcomes["malformed"] += 1
        else:
            outcomes["refused"] += 1
            assert reply.meta["error"].startswith(_REFUSALS), (case, reply.meta["error"])
        if case % 500 == 499:
            assert _state(service) == _state(reference), f"state differs after case {case}"
    elapsed = time.monotonic() - start
    local.close()
    remote.close()
    assert _state(service) == _state(reference)
    assert call(wire.encode({"method": "ping"}), timeout=10)  # still serving
    print(f"\nwire fuzz: {CASES} frames ({CASES // GRPC_EVERY} over gRPC, as many over the "
          f"local socket and over the sealed port) in {elapsed:.1f} s: "
          f"{outcomes}")
    assert outcomes["malformed"] > CASES // 2 and outcomes["refused"] > 0


def test_oversized_and_streamed_junk_is_refused_and_the_server_lives(live_server):
    service, channel, _ = live_server
    call = channel.unary_unary("/stratax.Service/Call")
    before = _state(service)
    with pytest.raises(grpc.RpcError) as err:          # over the message limit: gRPC refuses it
        call(b"SXPS" + bytes(rpc.CHUNK_BYTES + (2 << 20)), timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    junk = [b"SXPS\x01\x00" + bytes(rpc.CHUNK_BYTES - 6), bytes(1000)]   # a 2-chunk stream
    stream = channel.stream_stream("/stratax.Service/Stream")
    reply = wire.decode(b"".join(stream(iter(junk), timeout=10)))
    assert reply.meta["ok"] is False and reply.meta["kind"] == "wire"
    assert wire.decode(call(wire.encode({"method": "ping"}), timeout=10)).meta["ok"]
    assert _state(service) == before
