"""TFConfigClusterResolver: TF_CONFIG parsing, overrides, master() and every malformed input."""

from __future__ import annotations

import json
import logging
from typing import ClassVar

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
        ({"cluster": CLUSTER, "task": "worker"}, r"field 'task' must be an object"),
        ({"cluster": CLUSTER, "task": {"index": 0}}, r"has no 'type'"),
        ({"cluster": CLUSTER, "task": {"type": "worker"}}, r"has no 'index'"),
        ({"cluster": CLUSTER, "task": {"type": "", "index": 0}},
         r"'task.type' must be a non-empty"),
        ({"cluster": CLUSTER, "task": {"type": [1], "index": 0}},
         r"'task.type' must be a non-empty"),
        ({"cluster": CLUSTER, "task": {"type": 3, "index": 0}},
         r"task type '3' is not a job of the cluster"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": "one"}},
         r"'task.index' must be an integer, got 'one' \(str\).*\"index\": 1"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": "1.0"}},
         r"'task.index' must be an integer, got '1.0' \(str\)"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": 1.5}},
         r"'task.index' must be an integer, got 1.5 \(float\)"),
        ({"cluster": CLUSTER, "task": {"type": "worker", "index": "-1"}},
         r"must be >= 0, got '-1'"),
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
    with pytest.raises(ValueError, match=r"task_id must be an integer, got 'zero'"):
        TFConfigClusterResolver(task_type="worker", task_id="zero")
    with pytest.raises(ValueError, match=r"task index 7 is out of range"):
        TFConfigClusterResolver(task_type="worker", task_id=7)


def test_parse_tf_config_is_pure() -> None:
    config = parse_tf_config(
        '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}'
    )
    assert config.cluster == {"worker": ["a:1"]}
    assert (config.task_type, config.task_id, config.rpc_layer) == ("worker", 0, None)
    assert parse_tf_config(None).cluster == ClusterSpec({})


def test_whole_number_indices_are_cast_as_tensorflow_does(cluster_env: pytest.MonkeyPatch) -> None:
    """Shell scripts and templates quote the index; TensorFlow applies int() (issue 8, item 10)."""
    for index in ("1", " 1 ", 1.0, "+1"):
        _set(cluster_env, {"cluster": CLUSTER, "task": {"type": "worker", "index": index}})
        resolver = TFConfigClusterResolver()
        assert resolver.task_id == 1 and isinstance(resolver.task_id, int)
        assert resolver.master() == "host2:2222"
    assert TFConfigClusterResolver(task_id="0").task_id == 0


def test_a_task_is_only_required_where_it_is_needed(cluster_env: pytest.MonkeyPatch) -> None:
    """TensorFlow accepts a cluster without "task"; stratax fails where a task is needed
    (issue 8, item 11)."""
    from stratax._src.cluster.process_layout import process_layout

    _set(cluster_env, {"cluster": CLUSTER})
    resolver = TFConfigClusterResolver()
    assert (resolver.task_type, resolver.task_id) == (None, None)
    assert resolver.master("worker", 1) == "host2:2222"
    with pytest.raises(ValueError, match=r"master\(\) needs a task.*set TF_CONFIG's 'task'"):
        resolver.master()
    with pytest.raises(ValueError, match=r"this process' task is unknown.*\"task\": \{\"type\""):
        process_layout(resolver)


@pytest.mark.parametrize("job", ["worker", "chief"])
def test_one_task_cluster_without_task_is_that_task(cluster_env: pytest.MonkeyPatch,
                                                    job: str) -> None:
    from stratax._src.cluster.detect import detect_cluster_resolver
    from stratax._src.cluster.process_layout import process_layout

    _set(cluster_env, {"cluster": {job: ["worker0:2222"]}})
    resolver = detect_cluster_resolver()
    assert isinstance(resolver, TFConfigClusterResolver)
    assert resolver.master() == ""
    layout = process_layout(resolver)
    assert (layout.num_processes, layout.process_id) == (1, 0)
    assert (layout.task_type, layout.task_id) == (job, 0)


def test_one_ps_task_without_task_is_not_a_synchronous_worker(
    cluster_env: pytest.MonkeyPatch,
) -> None:
    from stratax._src.cluster.process_layout import process_layout

    _set(cluster_env, {"cluster": {"ps": ["ps0:2222"]}})
    with pytest.raises(ValueError, match=r"Task type 'ps' is not part of synchronous training"):
        process_layout(TFConfigClusterResolver())


class TestTensorFlowCases:
    """TensorFlow's tfconfig_cluster_resolver_test.py, case by case (same names, same values).

    Deliberate difference: ``testNumAcceleratorsFilterTasksByEnvVar`` lists devices through a
    TensorFlow session; stratax's resolvers never start JAX (``num_accelerators()`` reports only
    what the configuration states, ``{}`` for TF_CONFIG), so it has no counterpart here.
    """

    PS_WORKER: ClassVar[dict[str, list[str]]] = {"ps": ["ps0:2222", "ps1:2222"],
                 "worker": ["worker0:2222", "worker1:2222", "worker2:2222"]}

    def _resolver(self, cluster_env: pytest.MonkeyPatch, config: object,
                  **kwargs: object) -> TFConfigClusterResolver:
        _set(cluster_env, config)
        return TFConfigClusterResolver(**kwargs)  # type: ignore[arg-type]

    def test_normal_cluster_spec_read(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {"cluster": self.PS_WORKER,
                                                "task": {"type": "ps", "index": 0}})
        assert resolver.cluster_spec().as_dict() == self.PS_WORKER

    def test_automatic_master_read(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {"cluster": self.PS_WORKER,
                                                "task": {"type": "ps", "index": 0}})
        assert resolver.master() == "ps0:2222"

    def test_specified_task_type_and_index_master_read(
        self, cluster_env: pytest.MonkeyPatch
    ) -> None:
        resolver = self._resolver(cluster_env, {"cluster": self.PS_WORKER,
                                                "task": {"type": "ps", "index": 0}})
        assert resolver.master("worker", 1) == "worker1:2222"

    def test_session_master_read(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {"cluster": self.PS_WORKER,
                                                "session_master": "sessionmaster:2222",
                                                "task": {"type": "ps", "index": 0}})
        assert resolver.master() == "sessionmaster:2222"

    def test_rpc_layer_read(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {"cluster": self.PS_WORKER, "rpc_layer": "grpc",
                                                "task": {"type": "ps", "index": 0}})
        assert resolver.master() == "grpc://ps0:2222"

    def test_task_type_index_rpc_read(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {"cluster": self.PS_WORKER, "rpc_layer": "grpc",
                                                "task": {"type": "ps", "index": 0}})
        assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("ps", 0, "grpc")

    def test_parameter_overrides(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {"cluster": self.PS_WORKER, "rpc_layer": "grpc",
                                                "task": {"type": "ps", "index": 1}},
                                  task_type="ps", task_id=0)
        assert resolver.master() == "grpc://ps0:2222"
        assert (resolver.task_type, resolver.task_id) == ("ps", 0)
        resolver.task_type, resolver.task_id, resolver.rpc_layer = "worker", 1, "test"
        assert resolver.master() == "test://worker1:2222"
        assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "test")

    def test_task_type_cast_to_string(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {
            "cluster": {"123456": ["ps0:2222", "ps1:2222"], "worker": self.PS_WORKER["worker"]},
            "rpc_layer": "grpc", "task": {"type": 123456, "index": 0}})
        assert resolver.task_type == "123456"

    def test_task_index_cast_to_integer(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {"cluster": self.PS_WORKER, "rpc_layer": "grpc",
                                                "task": {"type": "ps", "index": "1"}})
        assert resolver.task_id == 1

    def test_task_index_override(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {
            "cluster": {"worker": ["worker0:2222", "worker1:2222"]},
            "task": {"type": "worker", "index": "0"}}, task_id=1)
        assert resolver.task_id == 1

    def test_zero_items_in_cluster_spec_master_read(self, cluster_env: pytest.MonkeyPatch) -> None:
        assert self._resolver(cluster_env, "\n    {}\n    ").master() == ""

    def test_one_item_in_cluster_spec_master_read(self, cluster_env: pytest.MonkeyPatch) -> None:
        resolver = self._resolver(cluster_env, {"cluster": {"worker": ["worker0:2222"]}})
        assert resolver.master() == ""
