"""The deployment files of ``examples/deploy/``, run for real as far as one machine allows.

Kubernetes: each pod's command runs with the environment Kubernetes and its controller give
that pod (``tests/deploy/render.py``: ``JOB_COMPLETION_INDEX``, host names and the downward
API for Indexed Jobs and JobSets, the operator's ``TF_CONFIG`` for TFJobs, Secrets), inside a
network namespace whose ``/etc/hosts`` maps each pod's DNS names to a loopback address of its
own, 127.0.0.<i> (``ip netns exec`` mounts ``/etc/netns/<ns>/hosts`` there), so the names
and ports of the manifests are used as they are. The image's ``/app`` is this checkout;
volume mounts are folders of the test.
Slurm: the batch script runs under bash, with the ``SLURM_*`` variables its ``#SBATCH`` lines
give, and ``srun``/``scontrol`` stood in by ``fake_slurm.py``.

Every run trains ``examples/deploy/train.py`` to the weights of one process (1e-5), the same
on every worker. By default the Indexed Job and the Slurm script run (the environments of
every file are checked without processes in ``tests/deploy/test_environments.py``). Slow: the
JobSet and both TFJobs, the Indexed Job across two network namespaces joined by a veth pair
(two hosts), and preemption: SIGTERM to one pod or to the Slurm tasks, exit code 42, the
restart each file prescribes, the same final weights. Needs root for namespaces; skipped with
the reason elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PROGRAMS, ROOT, Workers, assert_same_weights, load_weights, worker_env

pytestmark = pytest.mark.timeout(300)

TRAIN = ROOT / "examples" / "deploy" / "train.py"
SBATCH = ROOT / "examples" / "deploy" / "slurm" / "train.sbatch"
SECRETS = {("stratax-ps-token", "token"): "deploy-test-token-5d1c"}  # kubectl create secret
PREEMPTION_EXIT_CODE = 42


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


render = _load("_stratax_deploy_render", ROOT / "tests" / "deploy" / "render.py")
netns = _load("_stratax_netns", ROOT / "benchmarks" / "cluster" / "netns.py")


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if proc.returncode:
        raise netns.NetnsUnavailable(f"`ip {' '.join(args)}`: {proc.stderr.strip()}")


class Network:
    """Network namespaces whose ``/etc/hosts`` name the pods or nodes; removed by ``down``."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.bed = None

    def _hosts(self, name: str, entries: list[tuple[str, list[str]]]) -> None:
        folder = Path("/etc/netns") / name
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["127.0.0.1 localhost", *(f"{a} {' '.join(n)}" for a, n in entries if n)]
        (folder / "hosts").write_text("\n".join(lines) + "\n")

    def one_host(self, hosts: list[list[str]]) -> list[str]:
        """A namespace where the names ``hosts[i]`` resolve to 127.0.0.<i + 1>, an address of
        their own (as each pod has its IP: every TFJob task binds port 2222); returns the
        command prefix into it."""
        name = f"sxd{os.getpid()}"
        try:
            _ip("netns", "add", name)
            self.names.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        except (OSError, netns.NetnsUnavailable) as error:
            pytest.skip(f"cannot make network namespaces here: {error}")
        self._hosts(name, [(f"127.0.0.{i + 1}", names) for i, names in enumerate(hosts)])
        return ["ip", "netns", "exec", name]

    def two_hosts(self, names: tuple[list[str], list[str]]) -> tuple[list[str], list[str]]:
        """Two namespaces joined by a veth pair; ``names[i]`` resolve to host ``i``."""
        tag = os.getpid() % 200 + 20
        self.bed = netns.TestBed((f"sxe{os.getpid()}", f"sxf{os.getpid()}"),
                                 (f"10.214.{tag}.1", f"10.214.{tag}.2"))
        try:
            self.bed.up()
        except netns.NetnsUnavailable as error:
            pytest.skip(f"cannot make network namespaces here: {error}")
        entries = list(zip(self.bed.addresses, names, strict=True))
        for name in self.bed.names:
            self._hosts(name, entries)
        return self.bed.exec_prefix(0), self.bed.exec_prefix(1)

    def down(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)
        if self.bed is not None:
            self.bed.down()
        for name in self.names + list(self.bed.names if self.bed else ()):
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)


@pytest.fixture
def network():
    net = Network()
    yield net
    net.down()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in net.names), listed


_references: dict[tuple[str, ...], list] = {}


def reference(tmp_path_factory, *args: str) -> list:
    """Final weights of train.py as one process (local mode), once per argument list."""
    if args not in _references:
        out = tmp_path_factory.mktemp("reference")
        proc = subprocess.run([sys.executable, str(TRAIN), "--output", str(out), *args],
                              cwd=ROOT, env=worker_env(PYTHONUNBUFFERED="1"), timeout=180,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert _report(proc.stdout)["replicas"] == 1
        _references[args] = load_weights(out / "weights.npz")
    return _references[args]


def _report(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("{")]
    assert lines, output[-3000:]
    return json.loads(lines[-1])


def _volumes(pod, root: Path) -> dict[str, Path]:
    """Mount path -> local folder; pods mounting one claim share its folder."""
    volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
    mounts = {}
    for mount in pod.container.get("volumeMounts", []):
        claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
        mounts[mount["mountPath"].rstrip("/")] = root / claim
    return mounts


def _localize(pod, root: Path, extra_args=()) -> list[str]:
    """The container's command as arguments of this interpreter (the image's ``python`` and
    its ``stratax`` console script), volume paths mapped to the test's folders."""
    program, *rest = pod.argv
    head = {"python": [], "stratax": ["-m", "stratax"]}[program]
    mounts = _volumes(pod, root)
    out = []
    for arg in rest:
        for mount, local in mounts.items():
            if arg == mount or arg.startswith(mount + "/"):
                arg = str(local) + arg[len(mount):]
        out.append(arg)
    return [*head, *out, *extra_args]


def _local_path(pod, root: Path, flag: str) -> Path:
    args = _localize(pod, root)
    return Path(args[args.index(flag) + 1])


def _start_pods(workers: Workers, pods, prefixes, root: Path, extra_env=None, extra_args=()):
    procs = []
    for pod, prefix in zip(pods, prefixes, strict=True):
        env = pod.env(SECRETS)
        config = env.pop("TF_CONFIG", "")
        procs.append(workers.start(_localize(pod, root, extra_args), [config],
                                   extra_env={**env, **(extra_env or {})}, prefix=prefix,
                                   cwd=ROOT)[-1])
    return procs


def _dns_names(pods) -> list[list[str]]:
    """Each pod's DNS names; a pod no Service publishes could not be reached."""
    assert all(pod.dns_names for pod in pods), [pod.name for pod in pods if not pod.dns_names]
    return [pod.dns_names for pod in pods]


def _check_trained(pods, procs, outputs, weights: Path, expected, resolver: str,
                   replicas: int) -> None:
    reports = []
    for pod, proc, out in zip(pods, procs, outputs, strict=True):
        assert proc.returncode == 0, f"{pod.name} failed:\n{out[-3000:]}"
        if "train.py" in " ".join(pod.argv):
            reports.append(_report(out))
    assert {r["resolver"] for r in reports} == {resolver}
    assert [r["replicas"] for r in reports] == [replicas] * len(reports)
    assert sum(r["chief"] for r in reports) == 1
    assert len({r["weights_sha256"] for r in reports}) == 1  # every worker, bit for bit
    assert_same_weights(load_weights(weights), expected, tol=1e-5)


WORKLOADS = [
    pytest.param("indexed-job.yaml", "KubernetesClusterResolver", 2, id="indexed-job"),
    pytest.param("jobset.yaml", "KubernetesClusterResolver", 2, id="jobset",
                 marks=pytest.mark.slow),
    pytest.param("tfjob-multi-worker.yaml", "TFConfigClusterResolver", 2, id="tfjob-mwms",
                 marks=pytest.mark.slow),
    pytest.param("tfjob-parameter-server.yaml", "TFConfigClusterResolver", 2, id="tfjob-ps",
                 marks=pytest.mark.slow),
]


@pytest.mark.parametrize("manifest, resolver, replicas", WORKLOADS)
def test_pods_train_as_one_process(workers, network, tmp_path, tmp_path_factory, manifest,
                                   resolver, replicas) -> None:
    pods = render.pods_of(render.KUBERNETES / manifest)
    expected = reference(tmp_path_factory)
    prefix = network.one_host(_dns_names(pods))
    procs = _start_pods(workers, pods, [prefix] * len(pods), tmp_path)
    outputs = workers.wait(timeout=240)
    writer = next(p for p in pods if "--output" in p.argv)  # the chief, or every worker
    _check_trained(pods, procs, outputs, _local_path(writer, tmp_path, "--output") /
                   "weights.npz", expected, resolver, replicas)


@pytest.mark.slow
def test_indexed_job_across_two_hosts(workers, network, tmp_path, tmp_path_factory) -> None:
    """Pod 0 and pod 1 in two namespaces joined by a veth pair: the coordinator and gloo use
    the non-loopback addresses the pods' DNS names resolve to."""
    pods = render.pods_of(render.KUBERNETES / "indexed-job.yaml")
    expected = reference(tmp_path_factory)
    prefixes = network.two_hosts(tuple(pod.dns_names for pod in pods))
    # The namespaces share this machine's host name and boot id, so auto would choose shared
    # memory; gloo is what crosses hosts.
    procs = _start_pods(workers, pods, prefixes, tmp_path,
                        extra_env={"STRATAX_CPU_COLLECTIVES": "gloo"})
    outputs = workers.wait(timeout=240)
    assert "trusted private network" in outputs[0], outputs[0][-3000:]  # not loopback
    _check_trained(pods, procs, outputs, _local_path(pods[0], tmp_path, "--output") /
                   "weights.npz", expected, "KubernetesClusterResolver", 2)


def _wait_for_backup(folder: Path, procs, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while not (folder.is_dir() and any(folder.iterdir())):
        assert all(p.poll() is None for p in procs), "training ended before the first backup"
        assert time.monotonic() < deadline, f"no backup in {folder}"
        time.sleep(0.05)


# 880 steps, a backup after each (same numbers, slower steps): seconds of training, time
# enough to preempt it mid-run; the weights still match one process to 1e-5 (400 epochs: not).
PREEMPT_ARGS = ("--epochs", "40", "--save-freq", "1")


@pytest.mark.slow
def test_indexed_job_resumes_after_preemption(workers, network, tmp_path,
                                              tmp_path_factory) -> None:
    """SIGTERM to pod 1 (as the kubelet sends on eviction): both pods save and exit 42, the
    Job's podFailurePolicy says Ignore (re-create them), the new pods end as one process."""
    pods = render.pods_of(render.KUBERNETES / "indexed-job.yaml")
    expected = reference(tmp_path_factory, *PREEMPT_ARGS)
    prefix = network.one_host(_dns_names(pods))
    procs = _start_pods(workers, pods, [prefix] * 2, tmp_path, extra_args=PREEMPT_ARGS)
    _wait_for_backup(_local_path(pods[0], tmp_path, "--backup-dir"), procs)
    procs[1].send_signal(signal.SIGTERM)
    outputs = workers.wait(timeout=120)
    codes = [p.returncode for p in procs]
    assert codes == [PREEMPTION_EXIT_CODE] * 2, (codes, outputs[0][-2000:], outputs[1][-2000:])
    main = pods[0].container["name"]
    for pod, code in zip(pods, codes, strict=True):
        assert render.failure_action(pod.failure_policy, {main: code}) == "Ignore"
    restarted = Workers()
    try:
        procs = _start_pods(restarted, pods, [prefix] * 2, tmp_path, extra_args=PREEMPT_ARGS)
        outputs = restarted.wait(timeout=240)
    finally:
        restarted.kill_all()
    _check_trained(pods, procs, outputs, _local_path(pods[0], tmp_path, "--output") /
                   "weights.npz", expected, "KubernetesClusterResolver", 2)


# ------------------------------------------------------------------------------------ Slurm
class Slurm:
    """Runs the batch script as sbatch would, with fake srun/scontrol first on PATH."""

    def __init__(self, tmp_path: Path, prefix: list[str]) -> None:
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for tool in ("srun", "scontrol"):
            shim = self.bin / tool
            shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{PROGRAMS / "fake_slurm.py"}" '
                            f'{tool} "$@"\n')
            shim.chmod(0o755)
        self.shared = tmp_path / "shared"
        self.log = tmp_path / "scontrol.log"
        self.pids = tmp_path / "task_pids"
        self.namespace = prefix[-1] if prefix else ""

    def start(self, workers: Workers, restart: int = 0, args=()):
        env = render.sbatch_environment(SBATCH, "4242", restart)
        nodes = [f"node{i + 1}" for i in range(int(env["SLURM_NNODES"]))]
        env.update(PATH=f"{self.bin}{os.pathsep}{os.environ['PATH']}", PYTHON=sys.executable,
                   SHARED_DIR=str(self.shared), FAKE_SLURM_LOG=str(self.log),
                   FAKE_SLURM_PIDS=str(self.pids),
                   FAKE_SLURM_NETNS=",".join(f"{n}={self.namespace}" for n in nodes))
        return workers.start([str(SBATCH), *args], [""], extra_env=env, cwd=ROOT,
                             executable="bash")[-1]

    def requeues(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def test_slurm_script_trains_as_one_process(workers, network, tmp_path,
                                            tmp_path_factory) -> None:
    expected = reference(tmp_path_factory)
    slurm = Slurm(tmp_path, network.one_host([["node1"], ["node2"]]))
    proc = slurm.start(workers)
    (out,) = workers.wait(timeout=240)
    assert proc.returncode == 0, out[-3000:]
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["task"] for r in sorted(reports, key=lambda r: r["task"][1])] == [
        ["worker", 0], ["worker", 1]], out[-3000:]
    assert {r["resolver"] for r in reports} == {"SlurmClusterResolver"}
    assert {r["replicas"] for r in reports} == {2}
    assert len({r["weights_sha256"] for r in reports}) == 1
    assert_same_weights(load_weights(slurm.shared / "model" / "weights.npz"), expected, tol=1e-5)
    assert slurm.requeues() == []


def test_slurm_script_fails_on_errors_without_requeue(workers, network, tmp_path) -> None:
    slurm = Slurm(tmp_path, network.one_host([["node1"], ["node2"]]))
    proc = slurm.start(workers, args=["--epochs", "0"])  # train.py: usage error, exit 2
    (out,) = workers.wait(timeout=120)
    assert proc.returncode == 2, out[-3000:]
    assert "--epochs, --batch-size and --save-freq must be positive" in out
    assert slurm.requeues() == []


@pytest.mark.slow
def test_slurm_preemption_requeues_and_resumes(workers, network, tmp_path,
                                               tmp_path_factory) -> None:
    """SIGTERM to the tasks (Slurm's --signal=TERM@120, or a preemption): they save and exit
    42, the script requeues the job; the requeued run resumes to one process's weights."""
    expected = reference(tmp_path_factory, *PREEMPT_ARGS)
    slurm = Slurm(tmp_path, network.one_host([["node1"], ["node2"]]))
    proc = slurm.start(workers, args=PREEMPT_ARGS)
    _wait_for_backup(slurm.shared / "backup", [proc])
    for pid in slurm.pids.read_text().split():
        os.kill(int(pid), signal.SIGTERM)
    (out,) = workers.wait(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "preempted; requeueing job 4242" in out, out[-3000:]
    assert slurm.requeues() == ["requeue 4242"]
    again = Workers()
    try:
        proc = slurm.start(again, restart=1, args=PREEMPT_ARGS)
        (out,) = again.wait(timeout=240)
    finally:
        again.kill_all()
    assert proc.returncode == 0, out[-3000:]
    assert "restart 1" in out
    assert slurm.requeues() == ["requeue 4242"]
    assert_same_weights(load_weights(slurm.shared / "model" / "weights.npz"), expected, tol=1e-5)
