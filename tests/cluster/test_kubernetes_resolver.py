"""KubernetesClusterResolver: Indexed Job + headless Service, from the environment only."""

from __future__ import annotations

import pytest

from stratax._src.cluster.kubernetes import KubernetesClusterResolver
from stratax._src.cluster.process_layout import ProcessLayout, process_layout


def _pod(cluster_env: pytest.MonkeyPatch, index: int = 2, **extra: str) -> None:
    cluster_env.setenv("JOB_COMPLETION_INDEX", str(index))
    cluster_env.setenv("HOSTNAME", f"train-{index}")
    cluster_env.setenv("STRATAX_K8S_NUM_WORKERS", "4")
    cluster_env.setenv("STRATAX_K8S_SERVICE", "train-svc")
    for name, value in extra.items():
        cluster_env.setenv(name, value)


def test_job_name_from_hostname(cluster_env: pytest.MonkeyPatch) -> None:
    _pod(cluster_env)
    resolver = KubernetesClusterResolver()
    assert resolver.cluster_spec().as_dict() == {
        "worker": [f"train-{i}.train-svc:8888" for i in range(4)]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert resolver.master() == "train-2.train-svc:8888"
    assert process_layout(resolver) == ProcessLayout("train-0.train-svc:8888", 4, 2, "worker", 2)
    assert KubernetesClusterResolver.is_available()


def test_explicit_variables_and_arguments(cluster_env: pytest.MonkeyPatch) -> None:
    _pod(cluster_env, index=1, STRATAX_K8S_JOB_NAME="my-job-2", STRATAX_K8S_PORT="7000")
    resolver = KubernetesClusterResolver(rpc_layer="grpc")
    assert resolver.cluster_spec().task_address("worker", 3) == "my-job-2-3.train-svc:7000"
    assert resolver.master() == "grpc://my-job-2-1.train-svc:7000"
    resolver = KubernetesClusterResolver(job_name="other", service="svc", num_workers=2, port=1)
    assert resolver.cluster_spec().as_dict() == {"worker": ["other-0.svc:1", "other-1.svc:1"]}


@pytest.mark.parametrize(
    "overrides, kwargs, message",
    [
        ({"JOB_COMPLETION_INDEX": None}, {}, r"JOB_COMPLETION_INDEX is not set .*completionMode: "
                                            r"Indexed"),
        ({"JOB_COMPLETION_INDEX": "x"}, {}, r"JOB_COMPLETION_INDEX='x' is not an integer"),
        ({"STRATAX_K8S_NUM_WORKERS": None}, {}, r"STRATAX_K8S_NUM_WORKERS is not set .*pod "
                                                r"template"),
        ({"STRATAX_K8S_NUM_WORKERS": "0"}, {}, r"STRATAX_K8S_NUM_WORKERS='0' is not an integer "
                                               r">= 1"),
        ({"STRATAX_K8S_NUM_WORKERS": "2"}, {}, r"JOB_COMPLETION_INDEX=2 is not below the number "
                                               r"of workers 2"),
        ({"STRATAX_K8S_SERVICE": None}, {}, r"STRATAX_K8S_SERVICE is not set"),
        ({"STRATAX_K8S_SERVICE": "Train_Svc"}, {}, r"headless Service name 'Train_Svc' is not a "
                                                   r"valid DNS label"),
        ({"HOSTNAME": "laptop"}, {}, r"Cannot tell the Job's name: STRATAX_K8S_JOB_NAME is not "
                                     r"set and HOSTNAME='laptop' does not end with '-2'"),
        ({"HOSTNAME": None}, {}, r"HOSTNAME='' does not end with '-2'"),
        ({"STRATAX_K8S_JOB_NAME": "-bad"}, {}, r"Job name '-bad' is not a valid DNS label"),
        ({"STRATAX_K8S_PORT": "http"}, {}, r"STRATAX_K8S_PORT='http' is not an integer"),
        ({"STRATAX_K8S_PORT": "70000"}, {}, r"port must be an integer in 0..65535, got 70000"),
        ({}, {"num_workers": 0}, r"num_workers must be an integer >= 1, got 0"),
    ],
)
def test_malformed_environment(
    cluster_env: pytest.MonkeyPatch, overrides: dict, kwargs: dict, message: str
) -> None:
    _pod(cluster_env)
    for name, value in overrides.items():
        if value is None:
            cluster_env.delenv(name)
        else:
            cluster_env.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        KubernetesClusterResolver(**kwargs)


@pytest.mark.parametrize(
    "variables, available",
    [
        ({}, False),
        ({"JOB_COMPLETION_INDEX": "0"}, False),  # an Indexed Job that did not opt in
        ({"STRATAX_K8S_NUM_WORKERS": "2"}, False),
        ({"JOB_COMPLETION_INDEX": "0", "STRATAX_K8S_NUM_WORKERS": "2"}, True),
    ],
)
def test_is_available(cluster_env: pytest.MonkeyPatch, variables: dict, available: bool) -> None:
    for name, value in variables.items():
        cluster_env.setenv(name, value)
    assert KubernetesClusterResolver.is_available() is available
