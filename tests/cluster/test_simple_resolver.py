"""SimpleClusterResolver: returns what it was given, TF-style master()."""

from __future__ import annotations

import pytest

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.cluster.resolver import ClusterResolver
from stratax._src.cluster.simple import SimpleClusterResolver


def test_returns_what_it_was_given() -> None:
    spec = ClusterSpec({"chief": ["h0:1"], "worker": ["h1:1", "h2:1"]})
    resolver = SimpleClusterResolver(
        spec, master="grpc://m:1", task_type="worker", task_id=1, environment="cloud",
        num_accelerators={"GPU": 2}, rpc_layer="grpc",
    )
    assert isinstance(resolver, ClusterResolver)
    assert resolver.cluster_spec() == spec
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert resolver.environment == "cloud"
    assert resolver.rpc_layer == "grpc"
    assert resolver.num_accelerators() == {"GPU": 2}
    assert resolver.master("worker", 0) == "grpc://h1:1"
    assert resolver.master("chief", 0, rpc_layer="http") == "http://h0:1"
    assert resolver.master(rpc_layer="") == "grpc://m:1"
    assert not SimpleClusterResolver.is_available()


def test_defaults_and_dict_spec() -> None:
    resolver = SimpleClusterResolver({"worker": ["a:1"]})
    assert resolver.cluster_spec() == {"worker": ["a:1"]}
    assert resolver.master() == ""
    assert resolver.num_accelerators() == {}
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (None, None, None)
    assert "SimpleClusterResolver(task_type=None" in repr(resolver)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"cluster_spec": {"worker": ["a:1", "a:1"]}}, r"used by both worker\[0\] and worker\[1\]"),
        ({"cluster_spec": {}, "task_id": -1}, r"task_id must be an integer >= 0 or None, got -1"),
        ({"cluster_spec": {}, "task_id": "0"}, r"task_id must be an integer >= 0 or None, got '0'"),
        ({"cluster_spec": {}, "num_accelerators": {"GPU": -1}}, r"num_accelerators\['GPU'\]"),
        ({"cluster_spec": {}, "num_accelerators": {"GPU": 1.5}}, r"integer >= 0, got 1.5"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimpleClusterResolver(**kwargs)
