"""Two "hosts" for real: ``stratax launch --nnodes 2`` across two network namespaces.

The namespaces are joined by a veth pair (10.213.x.1 <-> .2, nothing routed elsewhere), so the
coordinator and gloo use a non-loopback interface as on two machines. Needs root (CAP_NET_ADMIN
and CAP_SYS_ADMIN for ``ip netns``); skipped with the reason where namespaces cannot be made.
Namespaces and links are removed in teardown.
"""

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time

import pytest
from conftest import PROGRAMS, ROOT, assert_same_weights, free_ports, load_weights, worker_env
from test_multi_worker import _reference

pytestmark = pytest.mark.timeout(300)


def _launch(bed, tmp_path, program, nproc_per_node, **env_vars):
    """``stratax launch --nnodes 2`` with one launcher per namespace; each node's output."""
    coordinator = f"{bed.addresses[0]}:{free_ports(1)[0]}"
    env = worker_env(PYTHONPATH=os.pathsep.join([str(PROGRAMS), str(ROOT)]), **env_vars)
    procs = []
    try:
        for rank in range(2):
            command = [*bed.exec_prefix(rank), sys.executable, "-m", "stratax._src.launch",
                       "--nnodes", "2", "--node-rank", str(rank), "--coordinator", coordinator,
                       "--nproc-per-node", str(nproc_per_node), "--timeout", "200",
                       "--coordinator-wait", "60", *program, str(tmp_path)]
            procs.append(subprocess.Popen(command, cwd=PROGRAMS, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    for rank, (p, out) in enumerate(zip(procs, outputs, strict=True)):
        assert p.returncode == 0, f"node {rank} failed:\n{out[-3000:]}"
    return outputs


def test_launch_across_two_namespaces_equals_one_process(two_hosts, tmp_path):
    # One process per namespace: nothing shares memory, gloo crosses the veth pair.
    outputs = _launch(two_hosts, tmp_path, ["mwms_program.py"], 1,
                      STRATAX_CPU_COLLECTIVES="gloo")
    # The coordinator listens on a non-loopback address: its trusted-network warning is logged.
    assert "trusted private network" in outputs[0], outputs[0][-3000:]
    w0, w1 = (load_weights(tmp_path / f"arrays_weights_{i}.npz") for i in (0, 1))
    assert_same_weights(w0, w1)
    weights, _, _ = _reference()
    assert_same_weights(w0, weights, tol=1e-5)


@pytest.mark.slow  # four training processes; the test above is the default run's two hosts
def test_two_hosts_of_two_processes_take_the_hierarchical_all_reduce(two_hosts, tmp_path):
    """auto on 2 namespaces x 2 processes: shared memory inside each, gloo between them; fit
    equals one process, the workers agree bit for bit, ``ctx.all_reduce`` sums exactly."""
    outputs = _launch(two_hosts, tmp_path, ["hier_program.py"], 2)
    text = "\n".join(outputs)
    assert text.count("hierarchical True hosts ((0, 1), (2, 3))") == 4, text[-3000:]
    assert "CPU collectives: hierarchical all-reduce" in text, text[-3000:]
    assert text.count("sum mismatches 0") == 4, text[-3000:]
    # fit's packed step (its epochs and last partial batch) and the run program's two calls.
    traced = [int(n) for n in re.findall(r"^(?:\[.*?\] )?hierarchical traced (\d+)", text,
                                         re.M)]
    assert len(traced) == 4 and min(traced) >= 3, text[-3000:]
    weights = [load_weights(tmp_path / f"arrays_weights_{i}.npz") for i in range(4)]
    for other in weights[1:]:
        assert_same_weights(weights[0], other)
    reference, _, _ = _reference()
    assert_same_weights(weights[0], reference, tol=1e-5)


def test_the_cluster_spec_lists_each_hosts_address(two_hosts, tmp_path):
    """Issue 49 #4 on two hosts: across nodes the launcher names only the coordinator; once the
    group forms, each worker is listed at its own host's address (not the coordinator's)."""
    outputs = _launch(two_hosts, tmp_path, ["launcher_env_program.py"], 1,
                      STRATAX_CPU_COLLECTIVES="gloo")
    reports = [json.loads(line[line.index("{"):]) for out in outputs
               for line in out.splitlines() if '"resolver"' in line]
    coordinator = reports[0]["spec_before"][0]
    port = int(coordinator.rsplit(":", 1)[1])
    assert coordinator == f"{two_hosts.addresses[0]}:{port}"
    every_worker = {"worker": [coordinator, f"{two_hosts.addresses[1]}:{port + 1}"]}
    assert [r["spec"] for r in reports] == [every_worker, every_worker], reports


def _wait_for(path, seconds, *procs):
    """Waits for ``path`` to exist; fails early with a launcher's log when one has ended."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        for proc, log in procs:
            assert proc.poll() is None, f"a launcher ended early:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {path.name} after {seconds} s"
        time.sleep(0.2)


def _kill_every_process(bed, host):
    """SIGKILLs every process in namespace ``host``; returns their pids."""
    pids = subprocess.run(["ip", "netns", "pids", bed.names[host]], capture_output=True,
                          text=True, timeout=20).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return pids


def test_an_elastic_job_loses_a_host_for_good_goes_on_and_grows_back(
        two_hosts, tmp_path, one_process_backup_weights):
    """``--nnodes 1:2 --max-restarts 0`` on both namespaces: host B's every process is killed
    (-9) while its worker stalls the step; A trains on alone from the backup (a lost node is
    no restart); a new launcher on B makes the job grow back to 2 at once. The end equals the
    uninterrupted run."""
    endpoint = f"{two_hosts.addresses[0]}:{free_ports(1)[0]}"
    env = worker_env(PYTHONPATH=os.pathsep.join([str(PROGRAMS), str(ROOT)]),
                     STRATAX_CPU_COLLECTIVES="gloo", STRATAX_PS_TOKEN=secrets.token_hex(16))
    # Round 0: worker 1 (on B) stalls at its 5th step; round 1: worker 0 (A alone) does.
    program = ["mwms_backup_program.py", str(tmp_path), str(tmp_path / "backup"),
               "pause@1+pause@0", "5"]
    procs = []

    def start(host, *extra):
        log = tmp_path / f"launcher_{host}_{len(procs)}.log"
        command = [*two_hosts.exec_prefix(host), sys.executable, "-m", "stratax._src.launch",
                   "--nnodes", "1:2", "--rdzv-endpoint", endpoint, "--rdzv-last-call", "2",
                   "--rdzv-heartbeat-timeout", "4", "--max-restarts", "0",
                   "--grace-period", "1", "--timeout", "200", "--coordinator-wait", "60",
                   *extra, *program]
        with open(log, "w") as out:
            procs.append((subprocess.Popen(command, cwd=PROGRAMS, env=env, stdout=out,
                                           stderr=subprocess.STDOUT, start_new_session=True),
                          log))
        return procs[-1]

    try:
        # B first: it waits for A's store, so both join round 0 within its last call.
        # Every node observes, or none: the run directory adds collectives to fit.
        b = start(1, "--run-dir", str(tmp_path / "run_b"))
        a = start(0, "--run-dir", str(tmp_path / "run"))
        _wait_for(tmp_path / "paused_0", 150, a, b)
        assert str(b[0].pid) in _kill_every_process(two_hosts, 1)  # host B is gone
        b[0].wait(timeout=20)
        _wait_for(tmp_path / "paused_1", 150, a)
        b = start(1, "--run-dir", str(tmp_path / "run_b"))
        for proc, log in (a, b):
            assert proc.wait(timeout=200) == 0, log.read_text()[-4000:]
    finally:  # the launchers and their workers (each in its own session)
        for host in (0, 1):
            _kill_every_process(two_hosts, host)
        for proc, _ in procs:
            proc.wait(timeout=20)
    text = a[1].read_text()
    assert "this node hosts the rendezvous store" in text, text[-4000:]
    assert re.search(r"round 1 opens: .*(is lost|failed)", text), text[-4000:]
    assert "round 1: 1 node(s)" in text and "1 worker(s) in all" in text, text[-4000:]
    assert "round 2 opens: " in text and "arrives (the job grows, to at most 2" in text, text
    assert "round 2: 2 node(s)" in b[1].read_text(), b[1].read_text()[-4000:]
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [(e["restart"], e["workers"]) for e in restarts] == [(1, 1), (2, 2)], restarts
    # Backups written by 2, then 1, then 2 workers: float rounding.
    for worker in (0, 1):
        assert_same_weights(load_weights(tmp_path / f"weights_{worker}.npz"),
                            one_process_backup_weights, tol=1e-6)
