"""A served task's start and end (issue 48 item 5): an address it cannot serve at is an error
at start naming it, and ``stratax server`` stopped by SIGTERM leaves no socket directory."""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
from cluster_helpers import cluster_addresses

import stratax as sx

pytestmark = pytest.mark.timeout(120)


def _spec(ps_address=None):
    """A ps and a worker on ports reserved together; ``ps_address`` replaces the ps'."""
    spec = cluster_addresses({"ps": 1, "worker": 1})
    if ps_address is not None:
        spec["ps"] = [ps_address]
    return spec


@pytest.mark.parametrize("job", ["ps", "worker"])
def test_port_zero_in_the_spec_is_an_error_at_start(job):
    spec = _spec()
    spec[job] = ["127.0.0.1:0"]
    with pytest.raises(ValueError, match=rf"{job}\[0\] has the address '127\.0\.0\.1:0', port 0: "
                                         r"it would listen on a random port.*fixed port, e\.g\. "
                                         r"127\.0\.0\.1:2222"):
        sx.Server(spec, job_name="ps", task_index=0)
    resolver = sx.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0)
    with pytest.raises(ValueError, match=r"port 0"):      # the chief says so too, at once
        sx.ParameterServerStrategy(resolver, timeout_seconds=5)


def test_an_unbindable_spec_address_is_an_error_at_start_naming_it(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match=rf"ps 0 could not listen on {address}, its address in "
                                          r"the cluster spec: the port is in use"):
            sx.Server(_spec(address), job_name="ps", task_index=0)
    # A host that is not this machine's (TEST-NET-1, never assigned), with the token a
    # non-loopback address needs.
    monkeypatch.setenv("STRATAX_PS_TOKEN", "a-cluster-key-" + "5" * 32)
    with pytest.raises(OSError, match=r"ps 0 could not listen on 192\.0\.2\.1:2222.*not an "
                                      r"address of this machine"):
        sx.Server(_spec("192.0.2.1:2222"), job_name="ps", task_index=0)


def _socket_dirs(pid):
    return glob.glob(os.path.join(tempfile.gettempdir(), f"stratax-rpc-{pid}-*"))


def test_stratax_server_removes_its_socket_directory_on_sigterm():
    spec = _spec()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAX_")}
    env["TF_CONFIG"] = json.dumps({"cluster": spec, "task": {"type": "ps", "index": 0}})
    proc = subprocess.Popen([sys.executable, "-m", "stratax._src.cli", "server"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        end = time.monotonic() + 60
        while not _socket_dirs(proc.pid) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.1)
        directories = _socket_dirs(proc.pid)
        assert directories, "the server never made its socket directory"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM     # ended by the signal, as before
        assert not any(os.path.exists(d) for d in directories), directories
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
