"""A parameter-server cluster across two "hosts": the ps in one network namespace, the chief
and a worker in another, joined by a veth pair (``benchmarks/cluster/netns.py``), with the
cluster's token, as a user runs it on two machines. By default the calls between the hosts
take the sealed TCP port (``transport/sealed.py``), and row-sparse training over it equals
dense SGD in one process. Needs root for ``ip netns``; skipped with the reason where namespaces
cannot be made (the ``two_hosts`` fixture). Processes are killed in teardown.
"""

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_helpers import PROGRAMS

from stratax._src.launch.network import reserve_free_ports

pytestmark = pytest.mark.timeout(180)

_ROOT = Path(__file__).resolve().parents[2]


def test_a_cluster_across_two_hosts_trains_over_sealed_tcp(two_hosts, tmp_path):
    a, b = two_hosts.addresses
    ps_port, worker_port, chief_port = reserve_free_ports(3)
    spec = {"chief": [f"{b}:{chief_port}"], "worker": [f"{b}:{worker_port}"],
            "ps": [f"{a}:{ps_port}"]}
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("STRATAX_") and k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST")}
    base.update(PYTHONUNBUFFERED="1", STRATAX_PS_TOKEN=secrets.token_urlsafe(32),
                STRATAX_LOG_LEVEL="info", PYTHONPATH=os.pathsep.join([str(PROGRAMS), str(_ROOT)]))
    tasks = [("ps", 0, ["-m", "stratax._src.cli", "server"]),
             ("worker", 1, ["-m", "stratax._src.cli", "server"]),
             ("chief", 1, [str(PROGRAMS / "chief_program.py"), "sparse"])]
    procs, logs = {}, {}
    try:
        for job, host, command in tasks:
            env = dict(base, TF_CONFIG=json.dumps({"cluster": spec,
                                                   "task": {"type": job, "index": 0}}))
            logs[job] = open(tmp_path / f"{job}.log", "w")  # noqa: SIM115 - closed below
            procs[job] = subprocess.Popen(
                [*two_hosts.exec_prefix(host), sys.executable, *command], cwd=PROGRAMS, env=env,
                stdout=logs[job], stderr=subprocess.STDOUT, start_new_session=True)
        code = procs["chief"].wait(timeout=150)
        out = (tmp_path / "chief.log").read_text()
        assert code == 0, out[-4000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for log in logs.values():
            log.close()
    result = json.loads([line for line in out.splitlines()
                         if line.startswith("RESULT ")][-1][len("RESULT "):])
    assert result["sparse"]["table_err"] < 1e-5 and result["sparse"]["w_err"] < 1e-5
    assert result["sparse"]["iterations"] == [12, 12, 12]
    # The chief reached the ps on the other host by its sealed port, the worker on its own
    # host by the local socket; the worker's log says the same of its calls to the ps.
    assert f"ps 0 at {a}:{ps_port}: calls go over {a}:" in out and "(sealed TCP)" in out, out
    assert f"worker 0 at {b}:{worker_port}: calls go over /" in out, out
    worker_log = (tmp_path / "worker.log").read_text()
    assert f"ps 0 at {a}:{ps_port}: calls go over {a}:" in worker_log, worker_log[-3000:]
