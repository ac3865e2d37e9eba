"""An echo server over the parameter servers' RPC layer, shared by the transport tests."""

import time

import pytest

from stratax._src.parameter_server.transport import rpc, rpc_server, wire


def echo(frame: wire.Frame) -> bytes:
    """Sleeps ``meta["sleep"]`` seconds, then answers with the request's ``x`` and tensors
    (or fails, with ``meta["fail"]``)."""
    time.sleep(frame.meta.get("sleep", 0))
    if frame.meta.get("fail"):
        raise KeyError("no such variable 'w'")
    return rpc.response({"x": frame.meta.get("x")}, frame.tensors)


@pytest.fixture
def echo_handler():
    """The echo server's handler, for a test that starts its own server."""
    return echo


@pytest.fixture
def echo_server():
    server = rpc_server.RpcServer("ps 0", "127.0.0.1", 0, echo, max_workers=2)
    server.start()
    yield server
    server.stop(0)
