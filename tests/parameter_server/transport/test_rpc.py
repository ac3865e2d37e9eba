"""The transport: TLS keyed by the token, loopback rule, deadlines, chunked frames."""

import time

import numpy as np
import pytest

from stratax._src.core.errors import WorkerUnavailableError
from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.transport import rpc
from stratax._src.parameter_server.transport.rpc_server import RpcServer


@pytest.fixture
def ps_server():
    service = ParameterServer()
    server = RpcServer("ps 0", "127.0.0.1", 0, service.handle, token="s3cret", max_workers=2)
    server.start()
    yield server
    server.stop(0)


def test_calls_need_the_token(ps_server):
    address = f"127.0.0.1:{ps_server.port}"
    good = rpc.RpcClient("ps 0", address, timeout=5, token="s3cret")
    bad = rpc.RpcClient("ps 0", address, timeout=5, token="wrong")
    none = rpc.RpcClient("ps 0", address, timeout=5, token="")
    try:
        assert good.call("ping").meta["ok"]
        with pytest.raises(WorkerUnavailableError, match=r"ps 0 at 127\.0\.0\.1:\d+ failed "
                           r"'ping': the TLS handshake failed, so it does not hold this "
                           r"cluster's key .*STRATAX_PS_TOKEN"):
            bad.call("ping")
        with pytest.raises(WorkerUnavailableError, match="it takes only TLS: set the cluster's "
                                                         "STRATAX_PS_TOKEN here too"):
            none.call("ping")
    finally:
        good.close()
        bad.close()
        none.close()


def test_large_frames_are_streamed(ps_server):
    client = rpc.RpcClient("ps 0", f"127.0.0.1:{ps_server.port}", timeout=20, token="s3cret")
    try:
        table = (np.random.default_rng(0).normal(size=(3 * rpc.CHUNK_BYTES // 256, 64))
                 .astype(np.float32))
        client.call("create", {"names": ["t"]}, [table])
        back = client.call("pull", {"names": ["t"]}, stream=True).tensors[0]
        np.testing.assert_array_equal(back, table)
    finally:
        client.close()


def test_non_loopback_bind_requires_a_token(monkeypatch):
    monkeypatch.delenv("STRATAX_PS_TOKEN", raising=False)
    monkeypatch.delenv("STRATAX_PS_TOKEN_FILE", raising=False)
    with pytest.raises(ValueError, match="STRATAX_PS_TOKEN"):
        RpcServer("ps 0", "0.0.0.0", 0, ParameterServer().handle)


def test_token_file(tmp_path, monkeypatch):
    path = tmp_path / "token"
    path.write_text("abc\n")
    monkeypatch.delenv("STRATAX_PS_TOKEN", raising=False)
    monkeypatch.setenv("STRATAX_PS_TOKEN_FILE", str(path))
    assert rpc.read_token() == "abc"


def test_missing_server_is_named_within_the_timeout():
    client = rpc.RpcClient("ps 1", "127.0.0.1:9", timeout=1)
    start = time.monotonic()
    try:
        with pytest.raises(WorkerUnavailableError, match=r"ps 1 at 127\.0\.0\.1:9"):
            client.wait_ready(1.5)
    finally:
        client.close()
    assert time.monotonic() - start < 5
