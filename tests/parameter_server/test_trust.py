"""Who may make a task do something: the attack of issue 35 against a real worker process.

A worker imports the function a coordinator names (that is how ``dataset_fn`` travels), and a
``__main__`` function brings the path of its script, which the worker loads. So a call that
names ``{"name": "__main__:f", "script": "/some/file.py"}`` runs that file inside the worker:
only the cluster's own chief may make it. Each test starts a real ``stratax server`` worker on
127.0.0.1 and sends it that call from this process (or a child of another uid); the file would
write a marker.
"""

import os
import pwd
import socket
import time

import grpc
import pytest
from as_nobody import send_as_nobody
from cluster_helpers import cluster  # noqa: F401 - `cluster` is a fixture

from stratax._src.parameter_server.transport import cluster_tls, local_socket, wire

pytestmark = pytest.mark.timeout(120)

_SCRIPT = """\
import pathlib
pathlib.Path({marker!r}).write_text("ran")


def f(ctx=None):
    while True:
        yield [0.0]
"""


@pytest.fixture
def attack(tmp_path):
    """(script path, marker path, request bytes): the call that makes a worker run the file."""
    marker = tmp_path / "marker"
    script = tmp_path / "evil.py"
    script.write_text(_SCRIPT.format(marker=str(marker)))
    request = wire.encode({"method": "iterator", "iterator": "evil",
                           "source": {"fn": {"name": "__main__:f", "script": str(script)}}})
    return script, marker, request


def _worker(cluster, env=None):  # noqa: F811 - fixture
    """Starts one generic worker (its ps is never started: the attack needs none) and returns
    its address once it listens."""
    spec = cluster.start("chief_program.py", {"worker": 1, "ps": 1}, generic=("worker0",),
                         skip=("ps0",), env=env)
    address = spec["worker"][0]
    host, port = address.rsplit(":", 1)
    end = time.monotonic() + 60
    while True:                    # a TCP connection: the port may take TLS only
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return address
        except OSError:
            if time.monotonic() > end:
                pytest.fail("the worker did not listen within 60 s:\n" + cluster.output("worker0"))
            time.sleep(0.2)


def _call(address, request, token=None, method="Call"):
    """One raw gRPC call to the worker, as any local process can make it (over the cluster's
    TLS keyed by ``token`` when one is given, else in clear); the error code and details, or
    ``(OK, reply meta)``."""
    if token is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, cluster_tls.channel_credentials(token), options=[
            ("grpc.ssl_target_name_override", cluster_tls.TARGET_NAME)])
    with channel:
        try:
            if method == "Stream":
                stub = channel.stream_stream("/stratax.Service/Stream")
                reply = b"".join(stub(iter([request]), timeout=30))
            else:
                reply = channel.unary_unary(f"/stratax.Service/{method}")(request, timeout=30)
        except grpc.RpcError as err:
            return err.code(), err.details()
    return grpc.StatusCode.OK, wire.decode(reply).meta


def _in_session(request, session):
    """``request`` with the chief's ``session`` field added."""
    frame = wire.decode(request)
    return wire.encode({**frame.meta, "session": session}, frame.tensors)


def test_a_local_process_cannot_make_a_worker_run_a_file(cluster, attack):  # noqa: F811
    _, marker, request = attack
    address = _worker(cluster)
    for method in ("Call", "Stream"):
        code, details = _call(address, request, method=method)
        assert code == grpc.StatusCode.UNAUTHENTICATED, (method, code, details)
        assert "STRATAX_PS_TOKEN" in details and "local socket" in details, details
    assert not marker.exists()
    log = cluster.output("worker0")
    assert "refused a gRPC call" in log and "no token" in log, log[-2000:]
    # The worker still serves its own cluster: the question "where is your local socket?"
    # needs no trust, and the socket answers only processes of the worker's uid (this one).
    code, endpoint = _call(address, b"", method="Local")
    assert code == grpc.StatusCode.OK and endpoint["uid"] == os.getuid(), endpoint


def test_a_wrong_or_missing_token_is_refused_and_the_right_one_is_obeyed(cluster, attack):  # noqa: F811
    _, marker, request = attack
    secret = "the-cluster-secret-0123456789"
    address = _worker(cluster, env={"STRATAX_PS_TOKEN": secret})
    for token in (None, "", "wrong", secret[:-1], secret + "0", secret.upper()):
        # No TLS handshake without the cluster's key: no call reaches the worker at all.
        code, details = _call(address, request, token=token)
        assert code == grpc.StatusCode.UNAVAILABLE, (token, code, details)
        assert ("handshake failed" if token is not None else "Socket closed") in details, details
        code, details = _call(address, b"", token=token, method="Local")
        assert code == grpc.StatusCode.UNAVAILABLE, (token, code, details)
    assert not marker.exists()
    # The token alone is not enough: a call outside the chief's session is refused too.
    code, meta = _call(address, request, token=secret)
    assert code == grpc.StatusCode.OK and not meta["ok"] and meta["type"] == "SessionError"
    assert not marker.exists()
    # The control: the same call in a chief's session (claimed with the token) runs the file,
    # so the refusals above are what stopped it.
    session = "tester-1-" + "c" * 32
    code, meta = _call(address, wire.encode({"method": "session", "session": session}),
                       token=secret)
    assert code == grpc.StatusCode.OK and meta["ok"], meta
    code, meta = _call(address, _in_session(request, session), token=secret)
    assert code == grpc.StatusCode.OK and meta["ok"], meta
    assert marker.read_text() == "ran"


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another uid needs root")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # the child only makes socket calls
def test_another_uid_cannot_use_the_local_socket(cluster, attack):  # noqa: F811
    _, marker, request = attack
    address = _worker(cluster)
    code, endpoint = _call(address, b"", method="Local")
    assert code == grpc.StatusCode.OK, endpoint
    path = endpoint["path"]
    assert send_as_nobody(path, request) == 3            # the private directory stops it
    os.chmod(os.path.dirname(path), 0o755)             # past the file system: the uid check
    os.chmod(path, 0o777)
    assert send_as_nobody(path, request) == 0
    assert not marker.exists()
    log = cluster.output("worker0")
    assert f"running as uid {pwd.getpwnam('nobody').pw_uid}" in log, log[-2000:]
    # The control: this process (the worker's uid) is trusted on the socket, as its chief is,
    # once it claims a chief session.
    session = "tester-1-" + "c" * 32
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(path)
        for frame in (wire.encode({"method": "session", "session": session}),
                      _in_session(request, session)):
            sock.sendall(len(frame).to_bytes(8, "little") + frame)
            reply = local_socket.recv_frame(sock, time.monotonic() + 30, "worker 0")
            assert wire.decode(reply).meta["ok"], wire.decode(reply).meta
    assert marker.read_text() == "ran"
