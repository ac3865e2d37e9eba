"""Starting the 2 worker processes of a multi-process benchmark (TF_CONFIG on given addresses).

With gloo each worker is its own process; with ``mpi`` one ``mpiexec`` starts both (MPI ranks
must equal the JAX process ids), one MPMD segment per worker with its own TF_CONFIG.
"""

from __future__ import annotations

import json
import os
import subprocess

from benchmarks import REPO_ROOT
from benchmarks.cluster.launch import free_ports

ROOT = REPO_ROOT


def start(commands: list[list[str]], *, transport: str = "gloo",
          addresses: tuple[str, ...] = ("127.0.0.1", "127.0.0.1"),
          namespaces: tuple[str | None, ...] = (None, None),
          extra_env: dict[str, str] | None = None) -> list[subprocess.Popen[str]]:
    """Starts worker ``i`` running ``commands[i]`` as task ``i`` of a worker cluster.

    Each process gets its own session (killed as a group by ``finish``); output is piped.
    """
    ports = free_ports(len(commands))
    cluster = {"worker": [f"{a}:{port}" for a, port in zip(addresses, ports, strict=False)]}
    base = {k: v for k, v in os.environ.items() if not k.startswith("STRATAX_")
            and k != "TF_CONFIG"}
    base["JAX_PLATFORMS"] = "cpu"
    base.update(extra_env or {})
    base["STRATAX_CPU_COLLECTIVES"] = transport  # explicit: unset means auto (shm on one host)
    configs = [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
               for i in range(len(commands))]
    lines, envs = [], []
    for index, command in enumerate(commands):
        if namespaces[index]:
            command = ["ip", "netns", "exec", namespaces[index], *command]
        lines.append(command)
        envs.append({**base, "TF_CONFIG": configs[index]})
    if transport == "mpi":
        line = ["mpiexec"]
        for index, command in enumerate(lines):
            line += ([":"] if index else []) + ["-n", "1", "-env", "TF_CONFIG", configs[index],
                                                 *command]
        lines, envs = [line], [base]
    return [subprocess.Popen(line, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, cwd=ROOT, start_new_session=True)
            for line, env in zip(lines, envs, strict=True)]


def finish(procs: list[subprocess.Popen[str]], timeout: float = 600) -> str:
    """Waits for ``procs`` (killing their groups at the deadline); returns worker 0's output.

    Raises:
        RuntimeError: a worker exited non-zero or worker 0 printed no ``RESULT`` line.
    """
    outputs = finish_all(procs, timeout)
    if "RESULT " not in outputs[0]:
        raise RuntimeError("worker 0 printed no result:\n" + outputs[0][-2500:])
    return outputs[0]


def finish_all(procs: list[subprocess.Popen[str]], timeout: float = 600) -> list[str]:
    """Waits for ``procs`` (killing their groups at the deadline); returns every output.

    Raises:
        RuntimeError: a worker exited non-zero (or was killed at the deadline).
    """
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        outputs = ["(timed out)"] * len(procs)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError("a worker failed:\n" + "\n".join(o[-2500:] for o in outputs))
    return outputs


def result(output: str) -> dict:
    """The JSON after the first ``RESULT `` line of a worker's output."""
    line = next(ln for ln in output.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])
