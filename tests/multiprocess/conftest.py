"""Helpers for tests with real worker processes on 127.0.0.1 (one CPU device per worker unless
set)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent.parent),
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

    def start(self, args, tf_configs, extra_env=None, *, prefix=(), cwd=HERE,
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
        deadline = time.monotonic() + timeout
        outputs = []
        for proc in self.procs:
            remaining = max(deadline - time.monotonic(), 1)
            out, _ = proc.communicate(timeout=remaining)
            outputs.append(out)
        return outputs

    def kill_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            if proc.stdout:
                proc.stdout.close()


@pytest.fixture
def workers():
    group = Workers()
    yield group
    group.kill_all()
