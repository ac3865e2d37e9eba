"""ClusterSpec: construction, accessors, equality and address validation."""

from __future__ import annotations

import pytest

from stratax._src.cluster.cluster_spec import ClusterSpec, parse_address


def test_dense_jobs_accessors() -> None:
    spec = ClusterSpec({"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"], "ps": ["h3:1"]})
    assert spec.jobs == ["chief", "worker", "ps"]
    assert spec.num_tasks("worker") == 2
    assert spec.task_indices("worker") == [0, 1]
    assert spec.task_address("worker", 1) == "h2:2222"
    assert spec.job_tasks("worker") == ["h1:2222", "h2:2222"]
    assert spec.total_tasks() == 4
    assert spec.as_dict() == {
        "chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"], "ps": ["h3:1"]
    }
    assert list(spec) == ["chief", "worker", "ps"]
    assert bool(spec)


def test_sparse_job_from_index_dict() -> None:
    spec = ClusterSpec({"worker": {2: "h2:1", 0: "h0:1"}})
    assert spec.task_indices("worker") == [0, 2]
    assert spec.num_tasks("worker") == 2
    assert spec.job_tasks("worker") == ["h0:1", None, "h2:1"]
    assert spec.as_dict() == {"worker": {0: "h0:1", 2: "h2:1"}}
    # A dict with contiguous indices from 0 comes back as a list.
    assert ClusterSpec({"worker": {1: "b:1", 0: "a:1"}}).as_dict() == {"worker": ["a:1", "b:1"]}


def test_json_style_string_indices_are_accepted() -> None:
    assert ClusterSpec({"worker": {"0": "a:1", "1": "b:1"}}) == {"worker": ["a:1", "b:1"]}


def test_empty_spec_is_falsy_and_repr() -> None:
    assert not ClusterSpec({})
    assert not ClusterSpec(None)
    assert ClusterSpec({}).total_tasks() == 0
    assert repr(ClusterSpec({"worker": ["a:1"]})) == "ClusterSpec({'worker': ['a:1']})"


def test_equality_and_hash() -> None:
    a = ClusterSpec({"worker": ["a:1", "b:2"], "ps": ["c:3"]})
    b = ClusterSpec({"ps": ["c:3"], "worker": ["a:1", "b:2"]})
    assert a == b
    assert hash(a) == hash(b)
    assert a == {"worker": ["a:1", "b:2"], "ps": ["c:3"]}
    assert a != ClusterSpec({"worker": ["b:2", "a:1"], "ps": ["c:3"]})
    assert a != {"worker": "not a list"}
    assert ClusterSpec(a) == a


def test_unknown_job_and_task_errors_name_what_exists() -> None:
    spec = ClusterSpec({"worker": ["a:1", "b:1"]})
    with pytest.raises(ValueError, match=r"No job named 'ps'.*\['worker'\]"):
        spec.num_tasks("ps")
    with pytest.raises(ValueError, match=r"Job 'worker' has no task 5.*\[0, 1\]"):
        spec.task_address("worker", 5)


@pytest.mark.parametrize(
    "address, expected",
    [
        ("localhost:8888", ("localhost", 8888)),
        ("10.0.0.1:0", ("10.0.0.1", 0)),
        ("node-01.cluster_a.example.com:65535", ("node-01.cluster_a.example.com", 65535)),
        ("[::1]:2222", ("::1", 2222)),
        ("[fe80::1%eth0]:80", ("fe80::1%eth0", 80)),
    ],
)
def test_parse_address_accepts(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    "address, message",
    [
        ("localhost", "expected 'host:port'"),
        ("localhost:", "expected 'host:port'"),
        (":8888", "expected 'host:port'"),
        ("host:port", "expected 'host:port'"),
        ("::1:2222", "expected 'host:port'"),
        ("host:-1", "expected 'host:port'"),
        ("host :1", "expected 'host:port'"),
        ("host:65536", "port 65536 is outside 0..65535"),
        (8888, "must be a 'host:port' string"),
        (None, "must be a 'host:port' string"),
    ],
)
def test_parse_address_rejects(address: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_address(address, "worker[3]")
    with pytest.raises(ValueError, match=r"worker\[0\]"):
        ClusterSpec({"worker": [address]})


def test_duplicate_address_names_both_tasks() -> None:
    with pytest.raises(ValueError, match=r"'a:1' is used by both worker\[1\] and ps\[0\]"):
        ClusterSpec({"worker": ["b:1", "a:1"], "ps": ["a:1"]})
    with pytest.raises(ValueError, match=r"used by both worker\[0\] and worker\[1\]"):
        ClusterSpec({"worker": ["Host:1", "host:1"]})
    # Same host, different ports is fine.
    assert ClusterSpec({"worker": ["a:1", "a:2"]}).num_tasks("worker") == 2


@pytest.mark.parametrize(
    "cluster, message",
    [
        ({"": ["a:1"]}, "Job names must be non-empty strings"),
        ({1: ["a:1"]}, "Job names must be non-empty strings"),
        ({"worker": "a:1"}, "must map to a list"),
        ({"worker": 3}, "must map to a list"),
        ({"worker": {-1: "a:1"}}, "task index -1"),
        ({"worker": {"x": "a:1"}}, "task index 'x'"),
        ({"worker": {True: "a:1"}}, "task index True"),
        ({"worker": {0: "a:1", "0": "b:1"}}, "task index 0 twice"),
    ],
)
def test_malformed_cluster(cluster: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterSpec(cluster)


def test_non_mapping_is_type_error() -> None:
    with pytest.raises(TypeError, match=r"expects a dict of job name to addresses, got \['a:1'\]"):
        ClusterSpec(["a:1"])  # type: ignore[arg-type]
