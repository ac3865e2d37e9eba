"""Stand-ins for Slurm's ``srun`` and ``scontrol``, to run a batch script on one machine.

``python fake_slurm.py srun [--kill-on-bad-exit=N] COMMAND...`` starts one task per slot of
the job's allocation (``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``, block distribution),
each with the variables slurmstepd gives a task (``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NODEID``, ``SLURMD_NODENAME``, ``SLURM_STEP_*``), inside the network namespace that
stands for its node when ``FAKE_SLURM_NETNS`` names one (``node1=ns1,node2=ns2``). It passes
SIGTERM and SIGINT on to the tasks and exits as srun does: with the highest exit code of the
tasks, 128 + N for a task killed by signal N. It writes the tasks' pids, one a line, to
``$FAKE_SLURM_PIDS``.

``python fake_slurm.py scontrol requeue JOBID`` appends ``requeue JOBID`` to
``$FAKE_SLURM_LOG``; any other command is an error, so a script that starts using one fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys


def expand_nodes(nodelist: str) -> list[str]:
    """``node[1-2,5]`` -> ``node1 node2 node5`` (the forms the tests use)."""
    nodes = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            nodes.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            for number in range(int(first), int(last or first) + 1):
                nodes.append(f"{prefix}{number:0{len(first)}d}")
    return nodes


def expand_counts(tasks_per_node: str) -> list[int]:
    """``2(x3),1`` -> ``2 2 2 1``."""
    counts = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if match is None:
            raise SystemExit(f"fake srun: cannot read SLURM_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def task_environments(environ: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    """``(node, environment)`` of every task srun starts in the job ``environ`` describes."""
    nodes = expand_nodes(environ["SLURM_JOB_NODELIST"])
    counts = expand_counts(environ["SLURM_TASKS_PER_NODE"])
    if len(nodes) != len(counts):
        raise SystemExit("fake srun: node list and tasks per node disagree")
    total = sum(counts)
    tasks = []
    for node_id, (node, count) in enumerate(zip(nodes, counts, strict=True)):
        for local in range(count):
            tasks.append((node, dict(
                environ, SLURM_PROCID=str(len(tasks)), SLURM_LOCALID=str(local),
                SLURM_NODEID=str(node_id), SLURMD_NODENAME=node, SLURM_STEP_ID="0",
                SLURM_STEPID="0", SLURM_STEP_NODELIST=environ["SLURM_JOB_NODELIST"],
                SLURM_STEP_NUM_NODES=str(len(nodes)), SLURM_STEP_NUM_TASKS=str(total),
                SLURM_STEP_TASKS_PER_NODE=environ["SLURM_TASKS_PER_NODE"])))
    return tasks


def srun(argv: list[str]) -> int:
    while argv and argv[0].startswith("-"):
        option = argv.pop(0)
        if not option.startswith("--kill-on-bad-exit="):
            raise SystemExit(f"fake srun: option {option!r} is not emulated")
    namespaces = dict(item.split("=") for item in
                      filter(None, os.environ.get("FAKE_SLURM_NETNS", "").split(",")))
    procs = []
    for node, env in task_environments(dict(os.environ)):
        prefix = ["ip", "netns", "exec", namespaces[node]] if node in namespaces else []
        procs.append(subprocess.Popen([*prefix, *argv], env=env))
    if os.environ.get("FAKE_SLURM_PIDS"):
        with open(os.environ["FAKE_SLURM_PIDS"], "w") as f:
            f.write("".join(f"{p.pid}\n" for p in procs))

    def forward(signum, _frame):
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [proc.wait() for proc in procs]
    return max(128 - code if code < 0 else code for code in codes)


def scontrol(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "requeue":
        print(f"fake scontrol: {' '.join(argv)!r} is not emulated", file=sys.stderr)
        return 1
    with open(os.environ["FAKE_SLURM_LOG"], "a") as f:
        f.write(f"requeue {argv[1]}\n")
    return 0


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    sys.exit({"srun": srun, "scontrol": scontrol}[command](rest))
