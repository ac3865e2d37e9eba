"""The wire parser: round trips, and malformed frames rejected with no state change (the
10,000-case fuzz against a live server is in ``test_wire_fuzz.py``)."""

import json
import struct

import numpy as np
import pytest

from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.transport import wire
from stratax._src.parameter_server.transport.rpc_server import RpcServer


def test_round_trip_keeps_dtype_shape_and_bytes():
    tensors = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(7, np.int64),
               np.zeros((0, 5), np.float16), np.array([True, False])]
    frame = wire.decode(wire.encode({"method": "x", "n": 1}, tensors))
    assert frame.meta == {"method": "x", "n": 1}
    for got, want in zip(frame.tensors, tensors, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_encode_refuses_objects():
    with pytest.raises(wire.WireError, match="object"):
        wire.encode({}, [np.array([object()])])


def _frame(header, payload=b"", version=wire.VERSION, magic=wire.MAGIC):
    text = json.dumps(header).encode()
    return struct.pack("<4sHI", magic, version, len(text)) + text + payload


@pytest.mark.parametrize("data, match", [
    (b"", "shorter"),
    (b"XXXX" + bytes(6), "starts with"),
    (_frame({"meta": {}, "tensors": []}, version=2), "version"),
    (struct.pack("<4sHI", wire.MAGIC, 1, 1 << 30) + b"{}", "header length"),
    (struct.pack("<4sHI", wire.MAGIC, 1, 3) + b"\xff\xfe{", "JSON"),
    (_frame([1, 2]), "exactly"),
    (_frame({"meta": [], "tensors": []}), "meta"),
    (_frame({"meta": {}, "tensors": {}}), "tensors"),
    (_frame({"meta": {}, "tensors": [{"dtype": "object", "shape": [1]}]}, bytes(8)), "dtype"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32", "shape": [-1]}]}), "dimension"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32", "shape": [True]}]}), "dimension"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32", "shape": [1.5]}]}), "dimension"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32", "shape": [1] * 9}]}), "at most"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32", "shape": [4]}]}, bytes(15)), "needs 16"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32", "shape": [4]}]}, bytes(17)), "trailing"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32", "shape": [1 << 20, 1 << 20]}]}),
     "larger"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32", "shape": [0, 2 ** 31, 2 ** 31,
                                                                    2 ** 31]}]}), "larger"),
    (_frame({"meta": {}, "tensors": [{"dtype": "float32"}]}), "'dtype' and 'shape'"),
])
def test_malformed_frames_are_rejected(data, match):
    with pytest.raises(wire.WireError, match=match):
        wire.decode(data)


def _server_with_state():
    server = ParameterServer()
    value = np.arange(6, dtype=np.float32).reshape(3, 2)
    server.handle(wire.decode(wire.encode({"method": "create", "names": ["v"]}, [value])))
    server.handle(wire.decode(wire.encode(
        {"method": "set_optimizer", "names": ["v"], "sparse_updates": "lazy",
         "spec": {"class_name": "SGD", "config": {"learning_rate": 1.0}}})))
    return server, value


def _value(server):
    return wire.decode(server.handle(wire.decode(
        wire.encode({"method": "pull", "names": ["v"]})))).tensors[0].copy()


@pytest.mark.parametrize("meta, tensors", [
    ({"method": "push", "step": "s", "dense": ["v"], "sparse": []}, [np.ones((2, 2), np.float32)]),
    ({"method": "push", "step": "s", "dense": ["v", "w"], "sparse": []},
     [np.ones((3, 2), np.float32), np.ones((3, 2), np.float32)]),
    ({"method": "push", "step": 1, "dense": ["v"], "sparse": []}, [np.ones((3, 2), np.float32)]),
    ({"method": "push", "step": "s", "dense": [], "sparse": ["v"]},
     [np.array([0, 0]), np.ones((2, 2), np.float32)]),
    ({"method": "push", "step": "s", "dense": [], "sparse": ["v"]},
     [np.array([2, 0]), np.ones((2, 2), np.float32)]),  # distinct but not sorted
    ({"method": "push", "step": "s", "dense": [], "sparse": ["v"]},
     [np.array([5]), np.ones((1, 2), np.float32)]),
    ({"method": "push", "step": "s", "dense": [], "sparse": ["v"]},
     [np.array([0.5]), np.ones((1, 2), np.float32)]),
    ({"method": "assign", "names": ["v"]}, [np.ones((3, 3), np.float32)]),
    ({"method": "nope"}, []),
    # A push that also pulls: a bad pull part rejects the whole request before the update.
    ({"method": "push", "step": "s", "dense": ["v"], "sparse": [],
      "pull": {"names": [], "row_names": ["v"]}}, [np.ones((3, 2), np.float32), np.array([3])]),
    ({"method": "push", "step": "s", "dense": ["v"], "sparse": [],
      "pull": {"names": ["w"], "row_names": []}}, [np.ones((3, 2), np.float32)]),
    ({"method": "push", "step": "s", "dense": ["v"], "sparse": [], "sync": 2,
      "pull": {"names": ["v"], "row_names": []}}, [np.ones((3, 2), np.float32)]),
])
def test_bad_requests_leave_the_server_unchanged(meta, tensors):
    server, value = _server_with_state()
    reply = wire.decode(RpcServer._dispatch(_Dispatcher(server), wire.encode(meta, tensors)))
    assert reply.meta["ok"] is False and reply.meta["error"]
    np.testing.assert_array_equal(_value(server), value)


class _Dispatcher:
    """Just what ``RpcServer._dispatch`` uses, to test it without a socket."""

    def __init__(self, server):
        self._handler = server.handle
        self.name = "ps 0"


def test_push_with_pull_returns_the_values_after_the_update():
    server, value = _server_with_state()
    grad = np.ones((3, 2), np.float32)
    reply = wire.decode(server.handle(wire.decode(wire.encode(
        {"method": "push", "step": "s1", "dense": ["v"], "sparse": [],
         "pull": {"names": ["v"], "row_names": ["v"]}}, [grad, np.array([2, 0])]))))
    whole, rows = reply.tensors
    np.testing.assert_array_equal(whole, value - 1.0)           # SGD, learning rate 1
    np.testing.assert_array_equal(rows, (value - 1.0)[[2, 0]])
    assert reply.meta["applied"] == 1


def test_tensors_are_aligned_views_writable_only_in_a_bytearray():
    frame = wire.encode({"method": "x" * 7}, [np.arange(5, dtype=np.float64), np.ones(3)])
    for data, writable in ((frame, False), (bytearray(frame), True)):
        for tensor in wire.decode(data).tensors:
            assert tensor.flags.aligned and tensor.flags.writeable is writable


def test_sparse_push_needs_sorted_distinct_rows_and_says_where_they_are_not():
    server, value = _server_with_state()
    bad = wire.encode({"method": "push", "step": "s", "dense": [], "sparse": ["v"]},
                      [np.array([0, 2, 2]), np.ones((3, 2), np.float32)])
    reply = wire.decode(RpcServer._dispatch(_Dispatcher(server), bad))
    assert "distinct and sorted" in reply.meta["error"]
    assert "rows[1]=2 then rows[2]=2" in reply.meta["error"]
    server.handle(wire.decode(wire.encode(
        {"method": "push", "step": "s", "dense": [], "sparse": ["v"]},
        [np.array([0, 2]), np.ones((2, 2), np.float32)])))
    np.testing.assert_array_equal(_value(server), value - [[1, 1], [0, 0], [1, 1]])
