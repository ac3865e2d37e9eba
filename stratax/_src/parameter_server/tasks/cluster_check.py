"""Every task of a parameter-server cluster must see the same cluster; checked at start.

Why: a worker whose ``ps`` list is in another order than the chief's pulls shards from the
wrong parameter server (``KeyError: No variable shard named ...`` later), and a task with another
``worker`` list shards its input differently without a word. So when the chief connects it sends
every task its view of the cluster (the ``worker`` and ``ps`` addresses, in order: a task's index
is its position) in a ``hello`` call; the task answers with its own view and which task it is,
and logs an error if they differ; the chief then fails before any training with an error naming
the task, the job that differs and the fix. The ``chief`` job is not compared (no task calls it).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from stratax._src.cluster.cluster_spec import ClusterSpec, parse_address
from stratax._src.parameter_server.transport import rpc, wire

logger = logging.getLogger(__name__)

JOBS = ("worker", "ps")
_FIX = ("Give every task the same TF_CONFIG \"cluster\" (only \"task\" differs from task to "
        "task) and start the cluster again.")


KNOWN_JOBS = ("chief", "worker", "ps", "evaluator")  # TensorFlow's allowed task types


def require_jobs(spec: ClusterSpec) -> None:
    """Checks, before any connection, that ``spec`` is a parameter-server cluster as TensorFlow
    validates one: only ``chief``/``worker``/``ps``/``evaluator`` jobs, at most one ``chief``
    and one ``evaluator``, at least one ``worker`` and one ``ps`` task, with no gap, each at a
    fixed port (a task served on port 0 would listen on a random port that no other task
    finds at its spec address).

    Raises:
      ValueError: naming the job and the fix.
    """
    unknown = sorted(set(spec.jobs) - set(KNOWN_JOBS))
    if unknown:
        raise ValueError(
            f"The cluster has job(s) {unknown} that a parameter-server cluster does not know "
            f"(got {spec.as_dict()}); its jobs are {list(KNOWN_JOBS)}: rename them in TF_CONFIG.")
    for job in ("chief", "evaluator"):
        count = len(spec.job_tasks(job)) if job in spec.jobs else 0
        if count > 1:
            raise ValueError(
                f"The cluster has {count} {job!r} tasks (got {spec.as_dict()[job]}); a "
                f"parameter-server cluster has at most one: list the others as 'worker' tasks.")
    for job in JOBS:
        tasks = spec.job_tasks(job) if job in spec.jobs else []
        if not tasks:
            raise ValueError(
                f"A parameter-server cluster needs at least one {job!r} task, got "
                f"{spec.as_dict()}; list its address in TF_CONFIG, e.g. "
                f"\"{job}\": [\"host:2222\"], or launch with "
                "`stratax launch --workers 2 --ps 1 train.py`.")
        if None in tasks:
            raise ValueError(
                f"Job {job!r} has no task {tasks.index(None)} (got {spec.as_dict()[job]}); a "
                f"parameter-server cluster numbers its {job!r} tasks 0..{len(tasks) - 1} "
                "without gaps.")
        for index, address in enumerate(tasks):
            if parse_address(address, f"{job}[{index}]")[1] == 0:
                raise ValueError(
                    f"{job}[{index}] has the address {address!r}, port 0: it would listen on a "
                    "random port, and the other tasks look for it at the port its cluster spec "
                    f"names; give it a fixed port, e.g. {address.rsplit(':', 1)[0]}:2222.")


def view(spec: ClusterSpec) -> dict[str, list[str]]:
    """The part of the cluster every task must agree on."""
    return {job: [str(a) for a in spec.job_tasks(job)] if job in spec.jobs else []
            for job in JOBS}


def fingerprint(cluster: dict[str, list[str]]) -> str:
    """A short digest of a view, for logs."""
    return hashlib.sha256(json.dumps(cluster, sort_keys=True).encode()).hexdigest()[:12]


def difference(here: dict[str, Any], there: dict[str, Any], here_name: str,
               there_name: str) -> str | None:
    """How ``there``'s view differs from ``here``'s, in words; None if they agree."""
    parts = []
    for job in JOBS:
        mine, theirs = here.get(job), there.get(job)
        if mine == theirs:
            continue
        hint = ""
        if isinstance(theirs, list) and sorted(map(str, theirs)) == sorted(mine or []):
            hint = " (the same addresses in another order; a task's index is its position)"
        parts.append(f"{job!r} is {theirs} on {there_name} but {mine} on {here_name}{hint}")
    return "; ".join(parts) or None


def _checked_view(meta: dict[str, Any]) -> dict[str, list[str]]:
    cluster = wire.require(meta, "cluster", dict)
    for job in JOBS:
        tasks = cluster.get(job)
        if not isinstance(tasks, list) or not all(isinstance(a, str) for a in tasks):
            raise wire.WireError(f"hello: 'cluster' must map {job!r} to a list of addresses.")
    return cluster


def answer_hello(frame: wire.Frame, spec: ClusterSpec, job: str, index: int) -> bytes:
    """A task's answer to the chief's ``hello``: its view and which task it is (and an error
    in its log when the chief's view differs)."""
    theirs = _checked_view(frame.meta)
    mine = view(spec)
    problem = difference(mine, theirs, f"{job} {index}", "the chief")
    if problem:
        logger.error("%s %d: the chief's cluster differs from this task's: %s. %s", job, index,
                     problem, _FIX)
    return rpc.response({"cluster": mine, "task": {"type": job, "index": index}})


def agree(clients: list[rpc.RpcClient], spec: ClusterSpec, timeout: float) -> None:
    """The chief's side: says ``hello`` to every task and checks that it sees the same cluster
    and is the task the chief's spec puts at its address.

    Raises:
      ValueError: a task sees another cluster, or is another task; the message names it, the
        difference and the fix.
    """
    mine = view(spec)
    for client in clients:
        meta = client.call("hello", {"cluster": mine}, timeout=timeout).meta
        theirs = meta.get("cluster") if isinstance(meta.get("cluster"), dict) else {}
        problem = difference(mine, theirs, "the chief", client.name)
        if problem:
            raise ValueError(
                f"{client.name} at {client.address} was started with another cluster than the "
                f"chief: {problem} (fingerprints {fingerprint(theirs)} there, "
                f"{fingerprint(mine)} here). {_FIX}")
        task = meta.get("task") or {}
        said = f"{task.get('type')} {task.get('index')}"
        if said != client.name:
            raise ValueError(
                f"The task at {client.address}, {client.name} in the chief's cluster, says it is "
                f"{said}. {_FIX}")
