"""TFConfigClusterResolver: TF_CONFIG parsing, overrides, master() and every malformed input."""

from __future__ import annotations

import json
import logging

import pytest

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.cluster.tfconfig import TFConfigClusterResolver, parse_tf_config

CLUSTER = {
    "chief": ["host0:2222"],
    "worker": ["host1:2222", "host2:2222"],
    "ps": ["host3:2222"],
}


def _set(cluster_env: pytest.MonkeyPatch, config: object) -> None:
    cluster_env.setenv("TF_CONFIG", config if isinstance(config, str) else json.dumps(config))


def test_happy_path(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {
        "cluster": CLUSTER,
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc",
        "environment": "cloud",
    })
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec(CLUSTER)
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.rpc_layer == "grpc"
    assert resolver.environment == "cloud"
    assert resolver.master() == "grpc://host2:2222"
    assert resolver.master("ps", 0, rpc_layer="http") == "http://host3:2222"
    assert resolver.num_accelerators() == {}
    assert TFConfigClusterResolver.is_available()


def test_constructor_arguments_override_tf_config(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"cluster": CLUSTER, "task": {"type": "worker", "index": 1},
                       "rpc_layer": "grpc", "environment": "cloud"})
    resolver = TFConfigClusterResolver(
        task_type="chief", task_id=0, rpc_layer="grpc+verbs", environment="google"
    )
    assert (resolver.task_type, resolver.task_id) == ("chief", 0)
    assert resolver.rpc_layer == "grpc+verbs"
    assert resolver.environment == "google"
    assert resolver.master() == "grpc+verbs://host0:2222"
    resolver.task_type, resolver.task_id = "worker", 0  # TF-style setters
    assert resolver.master(rpc_layer="") == "host1:2222"


def test_overrides_fill_a_missing_task(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"cluster": CLUSTER})
    resolver = TFConfigClusterResolver(task_type="ps", task_id=0)
    assert resolver.master() == "host3:2222"


@pytest.mark.parametrize("value", [None, "", "   ", "{}", '{"cluster": {}}'])
def test_local_mode(cluster_env: pytest.MonkeyPatch, value: str | None) -> None:
    if value is not None:
        _set(cluster_env, value)
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec() == ClusterSpec({})
    assert not resolver.cluster_spec()
    assert (resolver.task_type, resolver.task_id) == (None, None)
    assert resolver.master() == ""
    assert resolver.environment == ""
    assert TFConfigClusterResolver.is_available() == (value not in (None, "", "   "))


def test_single_task_cluster_has_empty_master(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}})
    assert TFConfigClusterResolver().master() == ""


def test_session_master_wins(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"cluster": CLUSTER, "task": {"type": "worker", "index": 0},
                       "session_master": "grpc://elsewhere:1"})
    assert TFConfigClusterResolver().master() == "grpc://elsewhere:1"


def test_evaluator_may_sit_outside_the_cluster(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"cluster": CLUSTER, "task": {"type": "evaluator", "index": 0}})
    resolver = TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == ("evaluator", 0)
    assert resolver.master("worker", 0) == "host1:2222"


def test_sparse_cluster_from_json_object_keys(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"cluster": {"worker": {"0": "a:1", "3": "b:1"}},
                       "task": {"type": "worker", "index": 3}})
    resolver = TFConfigClusterResolver()
    assert resolver.cluster_spec().task_indices("worker") == [0, 3]
    assert resolver.master() == "b:1"


def test_unknown_keys_are_ignored_with_a_warning(
    cluster_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _set(cluster_env, {"cluster": CLUSTER, "task": {"type": "worker", "index": 0, "trial": "1"},
                       "job": {"x": 1}})
    with caplog.at_level(logging.WARNING, logger="stratax._src.cluster.tfconfig"):
        resolver = TFConfigClusterResolver()
    assert resolver.task_id == 0
    assert "Ignoring unknown TF_CONFIG keys ['job']" in caplog.text
    assert "Ignoring unknown TF_CONFIG 'task' keys ['trial']" in caplog.text


def test_bad_json_shows_the_position(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, '{"cluster": {"worker": ["a:1" "b:1"]}}')
    with pytest.raises(ValueError) as info:
        TFConfigClusterResolver()
    message = str(info.value)
    assert "TF_CONFIG is not valid JSON: Expecting ',' delimiter at line 1, column 31" in message
    assert "(character 30)" in message
    lines = message.splitlines()
    # The caret points at the offending character in the excerpt above it.
    assert lines[2].index("^") == lines[1].index('"b:1"')
    assert "Fix the JSON" in message


@pytest.mark.parametrize(
    "config, message",
    [
        ("[1, 2]", r"TF_CONFIG must be a JSON object, got list"),
        ({"cluster": ["a:1"]}, r"field 'cluster' must be an object"),
        ({"cluster": {"worker": ["a:1", "nonsense"]}, "task": {"type": "worker", "index": 0}},
         r"field 'cluster' is invalid: The address of worker\[1\] is 'nonsense'"),
        ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}},
         r"'a:1' is used by both worker\[0\] and worker\[1\]"),
        ({"cluster": {"chief": ["a:1", "b:1"], "worker": ["c:1"]},
          "task": {"type": "worker", "index": 0}},
         r"has 2 'chief' tasks .* at most one chief, move the others to 'worker'"),
        ({"cluster": CLUSTER},
         r"no 'task' saying which one this process is.*\"task\": \{\"type\": \"worker\""),
        ({"cluster": CLUSTER, "task": "worker"}, r"field 'task' must be an object"),
        ({"cluster": CLUSTER, "task": {"index": 0}}, r"has no 'type'"),
        ({"cluster": CLUSTER, "task": {"type": "worker"}}, r"has no 'index'"),
        ({"cluster": CLUSTER, "task": {"type": 3, "index": 0}}, r"'task.type' must be a non-empty"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": "1"}},
         r"'task.index' must be an integer, got '1' \(str\).*\"index\": 1"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": 1.0}},
         r"'task.index' must be an integer, got 1.0 \(float\)"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": True}},
         r"'task.index' must be an integer, got True"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": -1}}, r"must be >= 0, got -1"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": 2}},
         r"task index 2 is out of range for job 'worker', which has task indices \[0, 1\]"),
        ({"cluster": CLUSTER, "task": {"type": "trainer", "index": 0}},
         r"task type 'trainer' is not a job of the cluster \(jobs: \['chief', 'worker', 'ps'\]\)"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": 0}, "rpc_layer": 5},
         r"field 'rpc_layer' must be a string, got 5"),
    ],
)
def test_malformed_tf_config(cluster_env: pytest.MonkeyPatch, config: object, message: str) -> None:
    _set(cluster_env, config)
    with pytest.raises(ValueError, match=message):
        TFConfigClusterResolver()


def test_bad_task_id_argument(cluster_env: pytest.MonkeyPatch) -> None:
    _set(cluster_env, {"cluster": CLUSTER})
    with pytest.raises(ValueError, match=r"task_id must be an integer, got '0'"):
        TFConfigClusterResolver(task_type="worker", task_id="0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"task index 7 is out of range"):
        TFConfigClusterResolver(task_type="worker", task_id=7)


def test_parse_tf_config_is_pure() -> None:
    config = parse_tf_config(
        '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'
    )
    assert config.cluster == {"worker": ["a:1"]}
    assert (config.task_type, config.task_id, config.rpc_layer) == ("worker", 0, None)
    assert parse_tf_config(None).cluster == ClusterSpec({})
