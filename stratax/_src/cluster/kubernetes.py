"""``KubernetesClusterResolver``: the cluster of a Kubernetes Indexed Job, from the environment.

An Indexed Job (``completionMode: Indexed``) gives each pod an index in ``JOB_COMPLETION_INDEX``
and the hostname ``<job-name>-<index>``; with ``subdomain`` set to a headless Service, every pod
is reachable as ``<job-name>-<index>.<service>``. So every pod can compute every other pod's
address on its own: no Kubernetes API client, no RBAC permissions, no waiting for pods to list.

Unlike TensorFlow's ``KubernetesClusterResolver`` (which queries the API server for pods by
label), this resolver only reads environment variables.
"""

from __future__ import annotations

import os
import re

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.core import env

DEFAULT_PORT = 8888

_POD_SPEC_HINT = (
    "set it in the Job's pod template (see KubernetesClusterResolver's docstring for the env "
    "block of an Indexed Job with a headless Service)."
)
# RFC 1123 DNS label: what Kubernetes accepts for Job and Service names used in hostnames.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _check_dns_label(value: str, what: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{what} {value!r} is not a valid DNS label (lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters); use the "
            "name exactly as Kubernetes shows it."
        )
    return value


class KubernetesClusterResolver(ClusterResolver):
    """Resolves the cluster of a Kubernetes Indexed Job whose pods share a headless Service.

    Every pod is a ``"worker"``; its task id is ``JOB_COMPLETION_INDEX``, and worker ``i`` lives
    at ``<job-name>-<i>.<service>:<port>``. Environment (explicit arguments win):

    - ``JOB_COMPLETION_INDEX`` (set by Kubernetes): this pod's index.
    - ``STRATAX_K8S_NUM_WORKERS`` (required): number of pods, the Job's ``completions``.
    - ``STRATAX_K8S_SERVICE`` (required): the headless Service, the pod template's ``subdomain``.
    - ``STRATAX_K8S_JOB_NAME`` (optional): the Job's name; defaults to ``$HOSTNAME`` without its
      ``-<index>`` suffix, which is how Kubernetes names Indexed Job pods. Set it from the pod
      label ``batch.kubernetes.io/job-name`` (``job-name`` before Kubernetes 1.27) as below.
    - ``STRATAX_K8S_PORT`` (optional, default 8888): the port every pod listens on.

    Pod spec (Job ``train``, 4 pods, headless Service ``train-svc`` with ``clusterIP: None`` and
    selector ``job-name: train``; ``publishNotReadyAddresses: true`` lets pods resolve each other
    before they are ready)::

        apiVersion: batch/v1
        kind: Job
        metadata: {name: train}
        spec:
          completions: 4
          parallelism: 4
          completionMode: Indexed
          template:
            spec:
              subdomain: train-svc
              restartPolicy: Never
              containers:
              - name: trainer
                image: my-image
                command: ["python", "train.py"]
                ports: [{containerPort: 8888}]
                env:
                - {name: STRATAX_K8S_NUM_WORKERS, value: "4"}
                - {name: STRATAX_K8S_SERVICE, value: train-svc}
                - name: STRATAX_K8S_JOB_NAME
                  valueFrom:
                    fieldRef: {fieldPath: "metadata.labels['batch.kubernetes.io/job-name']"}

    Example:
      >>> # In pod train-2 of the Job above:
      >>> resolver = KubernetesClusterResolver()
      >>> resolver.task_type, resolver.task_id
      ('worker', 2)
      >>> resolver.cluster_spec().task_address("worker", 0)
      'train-0.train-svc:8888'
    """

    def __init__(
        self,
        job_name: str | None = None,
        service: str | None = None,
        num_workers: int | None = None,
        port: int | None = None,
        rpc_layer: str | None = None,
    ) -> None:
        """Reads the pod's environment and builds the cluster.

        Args:
          job_name: The Job's name; overrides ``STRATAX_K8S_JOB_NAME`` and ``$HOSTNAME``.
          service: The headless Service; overrides ``STRATAX_K8S_SERVICE``.
          num_workers: Number of pods; overrides ``STRATAX_K8S_NUM_WORKERS``.
          port: Port of every pod; overrides ``STRATAX_K8S_PORT`` (default 8888).
          rpc_layer: Protocol prefix of ``master()`` addresses.

        Raises:
          ValueError: If a needed variable is missing or malformed, or the index is not below
            the number of workers.
        """
        index = env.get_int(
            env.JOB_COMPLETION_INDEX,
            "Kubernetes sets it only for Indexed Jobs: add `completionMode: Indexed` to the Job.",
        )
        if num_workers is None:
            num_workers = env.get_int(env.STRATAX_K8S_NUM_WORKERS, _POD_SPEC_HINT, minimum=1)
        elif isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}.")
        if index >= num_workers:
            raise ValueError(
                f"{env.JOB_COMPLETION_INDEX}={index} is not below the number of workers "
                f"{num_workers}; set {env.STRATAX_K8S_NUM_WORKERS} to the Job's completions."
            )
        if service is None:
            service = env.get_str(env.STRATAX_K8S_SERVICE, _POD_SPEC_HINT)
        service = _check_dns_label(service, "The headless Service name")
        job_name = _check_dns_label(self._resolve_job_name(job_name, index), "The Job name")
        if port is None:
            port = env.get_optional_int(env.STRATAX_K8S_PORT, minimum=0)
            port = DEFAULT_PORT if port is None else port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"The port must be an integer in 0..65535, got {port!r}.")
        self._cluster_spec = ClusterSpec(
            {"worker": [f"{job_name}-{i}.{service}:{port}" for i in range(num_workers)]}
        )
        self._task_type = "worker"
        self._task_id = index
        self._rpc_layer = rpc_layer

    @staticmethod
    def _resolve_job_name(job_name: str | None, index: int) -> str:
        if job_name is not None:
            return job_name
        from_env = os.environ.get(env.STRATAX_K8S_JOB_NAME, "").strip()
        if from_env:
            return from_env
        hostname = os.environ.get(env.HOSTNAME, "").strip()
        suffix = f"-{index}"
        if hostname.endswith(suffix) and len(hostname) > len(suffix):
            return hostname[: -len(suffix)]
        raise ValueError(
            f"Cannot tell the Job's name: {env.STRATAX_K8S_JOB_NAME} is not set and "
            f"{env.HOSTNAME}={hostname!r} does not end with '-{index}' as Indexed Job pods' "
            f"hostnames do; set {env.STRATAX_K8S_JOB_NAME} from the label "
            "metadata.labels['batch.kubernetes.io/job-name'] (downward API) or pass job_name=."
        )

    @classmethod
    def is_available(cls) -> bool:
        """True in an Indexed Job pod that opted in with ``STRATAX_K8S_NUM_WORKERS``.

        ``JOB_COMPLETION_INDEX`` alone is not enough: Indexed Jobs are also used for
        embarrassingly parallel work where each pod trains on its own.
        """
        return bool(
            os.environ.get(env.JOB_COMPLETION_INDEX, "").strip()
            and os.environ.get(env.STRATAX_K8S_NUM_WORKERS, "").strip()
        )

    def cluster_spec(self) -> ClusterSpec:
        """The ``"worker"`` job: one address per pod of the Indexed Job."""
        return self._cluster_spec
