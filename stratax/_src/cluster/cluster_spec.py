"""``ClusterSpec``: the jobs of a cluster and the ``host:port`` address of each task.

Modelled on TensorFlow's ``tf.train.ClusterSpec``: a job is a name (``"chief"``, ``"worker"``,
``"ps"``, ``"evaluator"``, ...) with a list of addresses, or a dict ``{task_index: address}`` for
a sparse job. Unlike TensorFlow, every address is validated when the spec is built, so a typo in
TF_CONFIG fails at start-up with a message naming the task, not minutes later in a connect call.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeAlias

# What ClusterSpec() accepts: a spec, {job: [address, ...]}, {job: {index: address}} or None.
ClusterInput: TypeAlias = "ClusterSpec | Mapping[str, Sequence[str] | Mapping[int, str]] | None"

_HOST_PORT = re.compile(r"^(?P<host>[A-Za-z0-9_.\-]+):(?P<port>[0-9]+)$")
_IPV6_PORT = re.compile(r"^\[(?P<host>[0-9A-Za-z:.%_\-]*:[0-9A-Za-z:.%_\-]*)\]:(?P<port>[0-9]+)$")
_MAX_PORT = 65535


def parse_address(address: object, where: str = "address") -> tuple[str, int]:
    """Splits a ``"host:port"`` (or ``"[ipv6]:port"``) string into host and port.

    Args:
      address: The address to check.
      where: What the address belongs to, for the error message (e.g. ``"worker[1]"``).

    Returns:
      ``(host, port)``; an IPv6 host is returned without its brackets.

    Raises:
      ValueError: If ``address`` is not a string of that form or the port is outside 0..65535.
    """
    if not isinstance(address, str):
        raise ValueError(
            f"The address of {where} must be a 'host:port' string, got {address!r} "
            f"({type(address).__name__}); write it like 'worker-0.example.com:8888'."
        )
    match = _HOST_PORT.match(address) or _IPV6_PORT.match(address)
    if match is None:
        raise ValueError(
            f"The address of {where} is {address!r}, expected 'host:port' with a numeric port "
            "(IPv6 hosts in brackets: '[::1]:8888'); fix the address, e.g. 'localhost:8888'."
        )
    port = int(match.group("port"))
    if port > _MAX_PORT:
        raise ValueError(
            f"The address of {where} is {address!r}: port {port} is outside 0..{_MAX_PORT}; "
            "choose a port in that range."
        )
    return match.group("host"), port


def _normalize_job(job: str, tasks: object) -> dict[int, str]:
    """Turns one job's tasks (list or ``{index: address}``) into a checked index -> address dict."""
    if isinstance(tasks, Mapping):
        result: dict[int, str] = {}
        for key, address in tasks.items():
            index = _parse_index(job, key)
            if index in result:
                raise ValueError(
                    f"Job {job!r} lists task index {index} twice (keys {key!r} and an equal one); "
                    "give each task one index."
                )
            parse_address(address, f"{job}[{index}]")
            result[index] = address
        return dict(sorted(result.items()))
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
        raise ValueError(
            f"Job {job!r} must map to a list of 'host:port' addresses or a dict "
            f"{{task_index: address}}, got {tasks!r} ({type(tasks).__name__}); "
            f"write e.g. {{{job!r}: ['host1:8888', 'host2:8888']}}."
        )
    for index, address in enumerate(tasks):
        parse_address(address, f"{job}[{index}]")
    return dict(enumerate(tasks))


def _parse_index(job: str, key: object) -> int:
    """Accepts an int task index, or a decimal string (JSON object keys are always strings)."""
    if isinstance(key, bool):
        index = None
    elif isinstance(key, int):
        index = key
    elif isinstance(key, str) and key.isdecimal():
        index = int(key)
    else:
        index = None
    if index is None or index < 0:
        raise ValueError(
            f"Job {job!r} has task index {key!r}; task indices must be integers >= 0, "
            f"e.g. {{{job!r}: {{0: 'host:8888'}}}}."
        )
    return index


class ClusterSpec:
    """The jobs of a cluster, each a set of tasks with a ``host:port`` address.

    Accepts a dict of job name to a list of addresses (task index = position) or to a dict
    ``{task_index: address}`` (sparse), or another ``ClusterSpec``. Addresses are validated and
    must be unique across the whole cluster.

    Example:
      >>> spec = ClusterSpec({"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]})
      >>> spec.num_tasks("worker")
      2
      >>> spec.task_address("worker", 1)
      'host2:2222'
    """

    def __init__(self, cluster: ClusterInput = None) -> None:
        """Builds and validates a cluster spec.

        Args:
          cluster: ``{job: [address, ...]}``, ``{job: {index: address}}``, a ``ClusterSpec`` or
            ``None``/``{}`` for an empty cluster (local mode).

        Raises:
          ValueError: If a job name, task index or address is malformed, or an address appears
            twice in the cluster.
          TypeError: If ``cluster`` is not a mapping or a ``ClusterSpec``.
        """
        if cluster is None:
            cluster = {}
        if isinstance(cluster, ClusterSpec):
            self._jobs: dict[str, dict[int, str]] = {
                job: dict(tasks) for job, tasks in cluster._jobs.items()
            }
            return
        if not isinstance(cluster, Mapping):
            raise TypeError(
                f"ClusterSpec expects a dict of job name to addresses, got {cluster!r} "
                f"({type(cluster).__name__}); write e.g. ClusterSpec({{'worker': ['host:8888']}})."
            )
        jobs: dict[str, dict[int, str]] = {}
        for job, tasks in cluster.items():
            if not isinstance(job, str) or not job:
                raise ValueError(
                    f"Job names must be non-empty strings, got {job!r}; use names such as "
                    "'chief', 'worker', 'ps' or 'evaluator'."
                )
            jobs[job] = _normalize_job(job, tasks)
        _check_unique_addresses(jobs)
        self._jobs = jobs

    @property
    def jobs(self) -> list[str]:
        """The job names, in the order they were given."""
        return list(self._jobs)

    def _tasks(self, job: str) -> dict[int, str]:
        try:
            return self._jobs[job]
        except KeyError:
            raise ValueError(
                f"No job named {job!r} in this cluster; its jobs are {self.jobs}."
            ) from None

    def num_tasks(self, job: str) -> int:
        """Number of tasks in ``job``; raises ``ValueError`` if the job does not exist."""
        return len(self._tasks(job))

    def task_indices(self, job: str) -> list[int]:
        """The task indices of ``job`` in increasing order (not contiguous for a sparse job)."""
        return list(self._tasks(job))

    def task_address(self, job: str, index: int) -> str:
        """The ``host:port`` address of task ``index`` of ``job``.

        Raises:
          ValueError: If the job or the task index does not exist.
        """
        tasks = self._tasks(job)
        try:
            return tasks[index]
        except KeyError:
            raise ValueError(
                f"Job {job!r} has no task {index!r}; its task indices are {list(tasks)}."
            ) from None

    def job_tasks(self, job: str) -> list[str | None]:
        """Addresses of ``job`` indexed by task index; a sparse job has ``None`` in its gaps."""
        tasks = self._tasks(job)
        if not tasks:
            return []
        return [tasks.get(index) for index in range(max(tasks) + 1)]

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """The spec as a dict: a dense job as a list of addresses, a sparse job as a dict."""
        result: dict[str, list[str] | dict[int, str]] = {}
        for job, tasks in self._jobs.items():
            if list(tasks) == list(range(len(tasks))):
                result[job] = list(tasks.values())
            else:
                result[job] = dict(tasks)
        return result

    def total_tasks(self) -> int:
        """Number of tasks over all jobs."""
        return sum(len(tasks) for tasks in self._jobs.values())

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterSpec):
            return self._jobs == other._jobs
        if isinstance(other, Mapping):
            try:
                return self._jobs == ClusterSpec(other)._jobs
            except (TypeError, ValueError):
                return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(sorted((job, tuple(tasks.items())) for job, tasks in self._jobs.items())))

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"


def _check_unique_addresses(jobs: Mapping[str, Mapping[int, str]]) -> None:
    """Raises ``ValueError`` naming both tasks when two tasks share an address."""
    seen: dict[tuple[str, int], str] = {}
    for job, tasks in jobs.items():
        for index, address in tasks.items():
            host, port = parse_address(address, f"{job}[{index}]")
            key = (host.lower(), port)
            here = f"{job}[{index}]"
            if key in seen:
                raise ValueError(
                    f"Address {address!r} is used by both {seen[key]} and {here}; every task "
                    "needs its own host:port (change the port of one of them)."
                )
            seen[key] = here
