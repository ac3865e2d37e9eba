"""``TFConfigClusterResolver``: the cluster described by the ``TF_CONFIG`` environment variable.

TF_CONFIG is the JSON that TensorFlow's multi-worker guides, Kubeflow's TFJob and Vertex AI set:

    {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"],
                 "ps": ["host3:2222"]},
     "task": {"type": "worker", "index": 1},
     "rpc_layer": "grpc", "environment": "cloud"}

Unlike TensorFlow, the whole value is parsed and checked when the resolver is built, so a
malformed TF_CONFIG fails at start-up with a message naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.cluster.resolver import ClusterResolver, format_master_url
from stratax._src.core import env

logger = logging.getLogger(__name__)

_KNOWN_KEYS = ("cluster", "task", "rpc_layer", "environment", "session_master")
_KNOWN_TASK_KEYS = ("type", "index")
# The evaluator runs beside the cluster, so TensorFlow lets it be absent from "cluster".
_JOBS_OUTSIDE_CLUSTER = ("evaluator",)
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")
_EXAMPLE = (
    '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
)


@dataclasses.dataclass(frozen=True)
class TFConfig:
    """The checked content of a TF_CONFIG value.

    Attributes:
      cluster: The ``cluster`` field (empty when absent: local mode).
      task_type: ``task.type``, or ``None`` when there is no ``task``.
      task_id: ``task.index``, or ``None`` when there is no ``task``.
      rpc_layer: ``rpc_layer``, or ``None``.
      environment: ``environment``, or ``""``.
      session_master: ``session_master`` (TF1), or ``None``.
    """

    cluster: ClusterSpec
    task_type: str | None = None
    task_id: int | None = None
    rpc_layer: str | None = None
    environment: str = ""
    session_master: str | None = None


def _json_error(text: str, error: json.JSONDecodeError) -> ValueError:
    start = max(0, error.pos - 30)
    excerpt = text[start : error.pos + 30]
    caret = " " * (error.pos - start) + "^"
    return ValueError(
        f"TF_CONFIG is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno} "
        f"(character {error.pos}):\n  {excerpt}\n  {caret}\nFix the JSON; a valid TF_CONFIG "
        f"looks like {_EXAMPLE}."
    )


def _optional_str(config: Mapping[str, object], key: str) -> str | None:
    value = config.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(
            f"TF_CONFIG field {key!r} must be a string, got {value!r} "
            f"({type(value).__name__}); e.g. \"{key}\": \"grpc\"."
        )
    return value


def _parse_task(task: object) -> tuple[str, int]:
    if not isinstance(task, Mapping):
        raise ValueError(
            f"TF_CONFIG field 'task' must be an object, got {task!r}; write "
            '"task": {"type": "worker", "index": 0}.'
        )
    unknown = sorted(set(task) - set(_KNOWN_TASK_KEYS))
    if unknown:
        logger.warning("Ignoring unknown TF_CONFIG 'task' keys %s.", unknown)
    if "type" not in task:
        raise ValueError(
            f"TF_CONFIG 'task' {dict(task)!r} has no 'type'; add the job name, e.g. "
            '"task": {"type": "worker", "index": 0}.'
        )
    if "index" not in task:
        raise ValueError(
            f"TF_CONFIG 'task' {dict(task)!r} has no 'index'; add this task's position in its "
            'job, e.g. "task": {"type": "worker", "index": 0}.'
        )
    return (_check_type(task["type"], "TF_CONFIG 'task.type'"),
            _check_index(task["index"], "TF_CONFIG 'task.index'"))


def _check_type(task_type: object, where: str) -> str:
    """A job name; an integer is cast to its string, as TensorFlow does (JSON keys are strings)."""
    if isinstance(task_type, int) and not isinstance(task_type, bool):
        return str(task_type)
    if not isinstance(task_type, str) or not task_type:
        raise ValueError(
            f"{where} must be a non-empty string, got {task_type!r}; e.g. "
            '"type": "worker".'
        )
    return task_type


def _check_index(index: object, where: str) -> int:
    """A task index: an int, or a string or float holding a whole number (TensorFlow casts them).

    Shell scripts and templates often quote the index (``"index": "1"``); TensorFlow applies
    ``int()``. A fraction or a boolean is refused rather than truncated: it is a mistake.
    """
    value: int | None = None
    if isinstance(index, int) and not isinstance(index, bool):
        value = index
    elif ((isinstance(index, float) and index.is_integer())
          or (isinstance(index, str) and _INTEGER.fullmatch(index))):
        value = int(index)
    if value is None:
        raise ValueError(
            f"{where} must be an integer, got {index!r} ({type(index).__name__}); write a whole "
            'number, e.g. "index": 1.'
        )
    if value < 0:
        raise ValueError(f"{where} must be >= 0, got {index!r}; task indices start at 0.")
    return value


def parse_tf_config(text: str | None) -> TFConfig:
    """Parses and checks a TF_CONFIG value; ``None`` or blank means local mode.

    Unknown top-level keys are ignored with a logged warning (TensorFlow ignores them silently).

    Raises:
      ValueError: If the value is not JSON, not an object, or a field is malformed: bad cluster
        addresses, duplicate addresses, more than one chief, a non-object ``task``, a missing or
        non-integer ``task.index``.
    """
    if text is None or not text.strip():
        return TFConfig(cluster=ClusterSpec({}))
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise _json_error(text, error) from None
    if not isinstance(config, Mapping):
        raise ValueError(
            f"TF_CONFIG must be a JSON object, got {type(config).__name__} {config!r}; "
            f"write e.g. {_EXAMPLE}."
        )
    unknown = sorted(set(config) - set(_KNOWN_KEYS))
    if unknown:
        logger.warning(
            "Ignoring unknown TF_CONFIG keys %s (known keys: %s).", unknown, list(_KNOWN_KEYS)
        )
    raw_cluster = config.get("cluster")
    if raw_cluster is None:
        cluster = ClusterSpec({})
    elif not isinstance(raw_cluster, Mapping):
        raise ValueError(
            f"TF_CONFIG field 'cluster' must be an object of job name to address list, got "
            f"{raw_cluster!r}; write e.g. \"cluster\": {{\"worker\": [\"host1:2222\"]}}."
        )
    else:
        try:
            cluster = ClusterSpec(raw_cluster)
        except (TypeError, ValueError) as error:
            raise ValueError(f"TF_CONFIG field 'cluster' is invalid: {error}") from None
    if "chief" in cluster.jobs and cluster.num_tasks("chief") > 1:
        raise ValueError(
            f"TF_CONFIG 'cluster' has {cluster.num_tasks('chief')} 'chief' tasks "
            f"{cluster.job_tasks('chief')}; a cluster has at most one chief, move the others "
            "to 'worker'."
        )
    task_type: str | None = None
    task_id: int | None = None
    if config.get("task") is not None:
        task_type, task_id = _parse_task(config["task"])
    environment = _optional_str(config, "environment")
    return TFConfig(
        cluster=cluster,
        task_type=task_type,
        task_id=task_id,
        rpc_layer=_optional_str(config, "rpc_layer"),
        environment=environment or "",
        session_master=_optional_str(config, "session_master"),
    )


def check_task_in_cluster(cluster: ClusterSpec, task_type: str | None, task_id: int | None) -> None:
    """Checks that a task, when one is named, is part of the cluster (the evaluator may sit
    outside it).

    A cluster without a task is accepted, as TensorFlow does: a one-task cluster needs none
    (``process_layout`` infers it), and where a task is really needed (``master()`` of a larger
    cluster, joining a multi-worker group) that step raises the error naming the fix.

    Raises:
      ValueError: If the task type is not a job of the cluster, or the index is out of range.
    """
    if cluster.total_tasks() == 0 or task_type is None or task_id is None:
        return
    if task_type not in cluster.jobs:
        if task_type in _JOBS_OUTSIDE_CLUSTER:
            return
        raise ValueError(
            f"TF_CONFIG task type {task_type!r} is not a job of the cluster (jobs: "
            f"{cluster.jobs}); set 'task.type' to one of them or add a {task_type!r} job."
        )
    indices = cluster.task_indices(task_type)
    if task_id not in indices:
        raise ValueError(
            f"TF_CONFIG task index {task_id} is out of range for job {task_type!r}, which has "
            f"task indices {indices}; set 'task.index' to one of them."
        )


class TFConfigClusterResolver(ClusterResolver):
    """Resolves the cluster from the ``TF_CONFIG`` environment variable.

    Without a ``cluster`` field (or without TF_CONFIG) the resolver is in local mode: an empty
    cluster spec, one process. Constructor arguments override the matching TF_CONFIG fields.
    As in TensorFlow, a quoted ``task.index`` (``"1"``) is cast to an integer, and a cluster
    without ``task`` is accepted: a one-task cluster runs as that task, and a larger one fails
    only where the task is needed (``master()``, joining a multi-worker group).
    TF_CONFIG is read once, when the resolver is built.

    Example:
      >>> os.environ["TF_CONFIG"] = json.dumps({
      ...     "cluster": {"worker": ["localhost:12345", "localhost:23456"]},
      ...     "task": {"type": "worker", "index": 1}})
      >>> resolver = TFConfigClusterResolver()
      >>> resolver.task_type, resolver.task_id
      ('worker', 1)
      >>> resolver.master()
      'localhost:23456'
    """

    def __init__(
        self,
        task_type: str | None = None,
        task_id: int | str | None = None,
        rpc_layer: str | None = None,
        environment: str = "",
    ) -> None:
        """Reads and checks TF_CONFIG.

        Args:
          task_type: Overrides ``task.type``.
          task_id: Overrides ``task.index`` (an integer, or a string holding one).
          rpc_layer: Overrides ``rpc_layer`` (protocol prefix of ``master()``).
          environment: Overrides ``environment``; ``""`` keeps TF_CONFIG's value.

        Raises:
          ValueError: If TF_CONFIG is malformed (see ``parse_tf_config``) or does not name this
            task inside its cluster.
        """
        config = parse_tf_config(os.environ.get(env.TF_CONFIG))
        if task_type is not None:
            task_type = _check_type(task_type, "task_type")
        if task_id is not None:
            task_id = _check_index(task_id, "task_id")
        self._config = config
        self._task_type = task_type if task_type is not None else config.task_type
        self._task_id = task_id if task_id is not None else config.task_id
        check_task_in_cluster(config.cluster, self._task_type, self._task_id)
        self._rpc_layer = rpc_layer if rpc_layer is not None else config.rpc_layer
        self._environment = environment or config.environment

    @classmethod
    def is_available(cls) -> bool:
        """True when TF_CONFIG is set and not blank."""
        return bool(os.environ.get(env.TF_CONFIG, "").strip())

    @property
    def environment(self) -> str:
        """The constructor's ``environment``, else TF_CONFIG's, else ``""``."""
        return self._environment

    def cluster_spec(self) -> ClusterSpec:
        """The ``cluster`` field of TF_CONFIG; empty in local mode."""
        return self._config.cluster

    def master(
        self,
        task_type: str | None = None,
        task_id: int | None = None,
        rpc_layer: str | None = None,
    ) -> str:
        """The address of a task (this one by default); see ``ClusterResolver.master``.

        Returns TF_CONFIG's ``session_master`` when set, and ``""`` when the cluster is empty or
        a single task (nothing to connect to), as TensorFlow does.
        """
        if self._config.session_master is not None:
            return self._config.session_master
        spec = self.cluster_spec()
        jobs = spec.jobs
        if not jobs or (len(jobs) == 1 and spec.num_tasks(jobs[0]) == 1):
            return ""
        task_type = task_type if task_type is not None else self.task_type
        task_id = task_id if task_id is not None else self.task_id
        if task_type is None or task_id is None:
            raise ValueError(
                f"master() needs a task, got task_type={task_type!r}, task_id={task_id!r}; pass "
                "them or set TF_CONFIG's 'task'."
            )
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        return format_master_url(spec.task_address(task_type, task_id), rpc_layer)
