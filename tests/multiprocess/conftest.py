"""Helpers for tests with real worker processes on 127.0.0.1 (one CPU device per worker unless
set)."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from stratax._src.launch.network import reserve_free_ports

ROOT = Path(__file__).parents[2]  # the checkout
PROGRAMS = Path(__file__).parent / "programs"  # what the workers run
# The tests import some programs' functions (``from data import ...``).
sys.path.insert(0, str(PROGRAMS))


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1, reserved together: ports taken one call at a
    time may repeat, or be taken between two calls."""
    return reserve_free_ports(count)


def worker_cluster(count: int) -> dict[str, list[str]]:
    """A ``{"worker": [...]}`` cluster of ``count`` addresses on 127.0.0.1."""
    return {"worker": [f"127.0.0.1:{port}" for port in free_ports(count)]}


# Other launchers' variables (torchrun, MPI, JAX jobs): a suite run under one of them must not
# hand its group to the workers a test starts.
_LAUNCHER_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                  "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                  "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_MCA_orte_hnp_uri", "PMI_RANK", "PMI_SIZE",
                  "PMIX_RANK", "MPI_LOCALRANKID", "JAX_COORDINATOR_ADDRESS",
                  "JAX_COORDINATOR_PORT", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def worker_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STRATAX_")
           and k not in ("TF_CONFIG", "PYTEST_CURRENT_TEST", "XLA_FLAGS", *_LAUNCHER_VARS)}
    # Children import the stratax under test (this checkout), not whatever is installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                      env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def load_weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[k] for k in data.files if k.startswith("arr_")]


def assert_same_weights(a, b, tol=0.0):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, atol=tol, rtol=tol)


class Workers:
    """Processes started by hand with TF_CONFIG; killed by process group at the end of the test."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, args, tf_configs, extra_env=None, *, prefix=(), cwd=PROGRAMS,
              executable=sys.executable):
        """Starts ``[*prefix, executable, *args]`` once per TF_CONFIG, each in its own session.

        ``prefix`` runs it through another program (``ip netns exec NAME``)."""
        for config in tf_configs:
            env = worker_env(TF_CONFIG=config, PYTHONUNBUFFERED="1", **(extra_env or {}))
            self.procs.append(subprocess.Popen(
                [*prefix, executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True))
        return self.procs

    def wait(self, timeout):
        """Every worker's output once all have exited. The pipes are drained at once, one
        thread per worker: read one after another, a chatty worker could block on its full
        pipe while its peer waits for it in a collective. Raises ``TimeoutExpired`` naming
        the first worker still running after ``timeout`` seconds."""
        outputs: list[str | None] = [None] * len(self.procs)
        errors: list[BaseException] = []

        def drain(index: int, proc: subprocess.Popen) -> None:
            try:
                outputs[index] = proc.communicate(timeout=timeout)[0]
            except BaseException as err:   # re-raised in the calling thread
                errors.append(err)

        threads = [threading.Thread(target=drain, args=(i, proc), daemon=True)
                   for i, proc in enumerate(self.procs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return outputs

    def kill_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()


# What a launched group must not inherit from the test process: XLA_FLAGS holds the 8-device
# split that `import stratax` made from STRATAX_CPU_DEVICES.
NOT_INHERITED = ("STRATAX_CPU_DEVICES", "TF_CONFIG", "XLA_FLAGS")


def launch_program(args, env=None, **kwargs):
    """``stratax launch`` of a program in PROGRAMS, its output captured; the workers import
    the stratax under test (this checkout), not whatever is installed."""
    from stratax._src.launch import launch

    path = os.pathsep.join([str(PROGRAMS), str(ROOT)])
    return launch([sys.executable, *map(str, args)], cwd=str(PROGRAMS), capture_output=True,
                  stream_output=False, env={**(env or {}), "PYTHONPATH": path}, **kwargs)


@pytest.fixture(scope="session")
def one_process_backup_weights():
    """The final weights of ``mwms_backup_program.py``'s training without a fault, in this
    process on one device: the reference of the tests that resume that program on another
    number of workers (a sum over other replicas: float rounding), once per session."""
    import mwms_backup_program

    import stratax as sx

    return mwms_backup_program.train(sx.MirroredStrategy(["cpu:0"])).get_weights()


@pytest.fixture(scope="session")
def uninterrupted_backup_weights(tmp_path_factory):
    """The final weights of ``mwms_backup_program.py`` on 2 workers without a fault: the
    reference of a test that resumes that program on as many workers, bit for bit."""
    out = tmp_path_factory.mktemp("uninterrupted")
    with pytest.MonkeyPatch.context() as patch:
        for name in NOT_INHERITED:
            patch.delenv(name, raising=False)
        result = launch_program(["mwms_backup_program.py", out, out / "backup", "none", 0],
                                nproc_per_node=2, max_restarts=0, timeout=300)
    assert result.ok and result.restarts == 0, result.summary
    return load_weights(out / "weights_0.npz")


@pytest.fixture
def workers():
    group = Workers()
    yield group
    group.kill_all()
