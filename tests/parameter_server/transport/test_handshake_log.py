"""gRPC's line for each refused TLS peer, rate-limited in a served task (issue 48): a flood of
peers without the cluster's key leaves one line per interval with a count, and every other byte
of the task's stderr passes unchanged, its last words included."""

import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest
from cluster_helpers import cluster_addresses

from stratax._src.parameter_server.transport import handshake_log, rpc

pytestmark = pytest.mark.timeout(120)

_REFUSED = ("I1206 19:29:29.771840   26389 ssl_transport_security.cc:2563] Handshake failed "
            "with error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
            "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate\n")
_WHY = "SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED"


def _filtered(pieces, every_seconds):
    """What the filter writes for ``pieces`` written one by one (each a separate read; a
    number is a pause of that many seconds)."""
    source_r, source_w = os.pipe()
    sink_r, sink_w = os.pipe()
    out = []
    reader = threading.Thread(target=lambda: out.append(_read_all(sink_r)))
    reader.start()

    def write():
        for piece in pieces:
            if isinstance(piece, float):
                time.sleep(piece)
                continue
            os.write(source_w, piece.encode())
            time.sleep(0.05)  # a separate read for each piece
        os.close(source_w)

    writer = threading.Thread(target=write)
    writer.start()
    handshake_log._run(source_r, sink_w, every_seconds)
    os.close(sink_w)
    writer.join(10)
    reader.join(10)
    os.close(source_r)
    os.close(sink_r)
    return out[0].decode()


def _read_all(fd):
    data = b""
    while chunk := os.read(fd, 1 << 16):
        data += chunk
    return data


def test_the_filter_keeps_one_handshake_line_per_interval_and_passes_the_rest():
    other_grpc = "I1206 19:29:29.1   1 fork_posix.cc:71] Other threads are calling into gRPC\n"
    quoted = "my note: " + _REFUSED
    pieces = ["Traceback (most recent call last):\n", _REFUSED, _REFUSED * 3,
              _REFUSED[:40], _REFUSED[40:] + other_grpc,  # a gRPC line cut across two reads
              quoted, "prompt> ", "typed\n", _REFUSED, "no newline at the end"]
    got = _filtered(pieces, every_seconds=3600)
    assert got == (
        "Traceback (most recent call last):\n"
        f"stratax: refused a TLS handshake (a peer without this cluster's key): {_WHY}: unable "
        "to get local issuer certificate (1 refused since the last such message)\n"
        + other_grpc + quoted + "prompt> typed\nno newline at the end"
        "stratax: refused 5 more TLS handshake(s) (peers without this cluster's key) since the "
        "last such message\n")
    # With a short interval, the next refusal after it is reported with the count of the
    # ones it held back.
    got = _filtered([_REFUSED * 5, "x\n", 1.0, _REFUSED], 0.1)
    counts = [int(n) for n in re.findall(r"\((\d+) refused since the last such message\)", got)]
    assert counts == [1, 5] and "more TLS" not in got and "Handshake failed" not in got


def _refused_peer(address, first_bytes):
    """Connects to ``address`` as a peer without the cluster's key (``first_bytes`` in clear,
    or, when None, TLS without a client certificate) and waits until the server hangs up."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        if first_bytes is not None:
            conn.sendall(first_bytes)
            while conn.recv(1 << 16):
                pass
            return
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with context.wrap_socket(conn) as tls, contextlib.suppress(ssl.SSLError, OSError):
            while tls.recv(1 << 16):  # the server's alert: no certificate
                pass


def test_a_served_task_rate_limits_refused_tls_peers_and_keeps_its_last_words(tmp_path):
    """A real ``stratax server`` ps with a token; twelve peers without the key connect (a
    plaintext gRPC client's preface, an HTTP request, TLS without a client certificate), each
    of which gRPC would log a line for. Its stderr has no gRPC handshake line, one stratax
    line at the first, and, after it is killed with SIGKILL (no chance to flush anything), the
    count of the rest and every line it wrote before (the filter is a process of its own,
    which drains the pipe)."""
    spec = cluster_addresses({"ps": 1, "worker": 1})
    address = spec["ps"][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STRATAX_", "GRPC_"))}
    env.update(STRATAX_PS_TOKEN="the-cluster-key-" + "7" * 32, STRATAX_PS_TRANSPORT="grpc",
               TF_CONFIG=json.dumps({"cluster": spec, "task": {"type": "ps", "index": 0}}))
    # The task's program: `stratax server`, and a line on stderr right before its SIGKILL.
    program = ("import os, signal, sys, threading, time\n"
               "from stratax._src import cli\n"
               "def last_words():\n"
               f"    while not os.path.exists({str(tmp_path / 'kill')!r}): time.sleep(0.05)\n"
               "    sys.stderr.write('last words before SIGKILL\\n'); sys.stderr.flush()\n"
               "    os.kill(os.getpid(), signal.SIGKILL)\n"
               "threading.Thread(target=last_words, daemon=True).start()\n"
               "sys.argv = ['stratax', 'server']\n"
               "cli.main()\n")
    proc = subprocess.Popen([sys.executable, "-c", program], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        keyed = rpc.RpcClient("ps 0", address, timeout=10, token=env["STRATAX_PS_TOKEN"],
                              transport="grpc")
        keyed.wait_ready(60)  # served (the filter was in place before the server started)
        keyed.close()
        for first_bytes in [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"GET / HTTP/1.0\r\n\r\n",
                            None] * 4:
            _refused_peer(address, first_bytes)
        (tmp_path / "kill").touch()
        _, err = proc.communicate(timeout=60)  # until the filter has drained and exited
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    err = err.decode()
    assert proc.returncode == -signal.SIGKILL
    assert "Handshake failed" not in err, err
    first = re.findall(r"stratax: refused a TLS handshake \(a peer without this cluster's key\): "
                       r"SSL_ERROR_SSL: .*WRONG_VERSION_NUMBER.* \((\d+) refused since the "
                       r"last such message\)", err)
    rest = re.findall(r"stratax: refused (\d+) more TLS handshake\(s\)", err)
    assert first == ["1"] and rest == ["11"], err
    assert err.index("last words before SIGKILL") < err.index("more TLS handshake"), err
