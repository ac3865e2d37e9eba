"""A cluster TensorFlow's ParameterServerStrategy would refuse is refused at once, before any
connection (TensorFlow's `parameter_server_strategy_v2_test` cases: an unknown job name, more
than one chief or evaluator), not after waiting for tasks that will never answer."""

import time

import pytest

import stratax as sx
from stratax._src.parameter_server.tasks.server import Server

BASE = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}


@pytest.mark.parametrize("extra, message", [
    ({"trainer": ["127.0.0.1:4"]}, r"job\(s\) \['trainer'\] that a parameter-server cluster"),
    ({"chief": ["127.0.0.1:1", "127.0.0.1:4", "127.0.0.1:5"]}, "has 3 'chief' tasks"),
    ({"evaluator": ["127.0.0.1:4", "127.0.0.1:5"]}, "has 2 'evaluator' tasks"),
])
def test_a_bad_cluster_is_a_value_error_at_once(extra, message):
    spec = {**BASE, **extra}
    started = time.monotonic()
    with pytest.raises(ValueError, match=message):
        sx.ParameterServerStrategy(sx.cluster_resolver.SimpleClusterResolver(
            spec, task_type="chief", task_id=0), timeout_seconds=30)
    assert time.monotonic() - started < 5  # no wait for tasks (the timeout is 30 s)
    with pytest.raises(ValueError, match=message):
        Server(spec, job_name="worker", task_index=0, start=False)


def test_one_evaluator_is_accepted_in_the_cluster():
    spec = {**BASE, "evaluator": ["127.0.0.1:4"]}
    server = Server(spec, job_name="ps", task_index=0, start=False)
    assert server is not None
