"""XLA threads of a worker task: the host's cores shared among the workers on it."""

import pytest

from stratax._src.cluster.cluster_spec import ClusterSpec
from stratax._src.parameter_server.tasks import compute_threads

SPEC = ClusterSpec({"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"],
                    "worker": ["127.0.0.1:3", "localhost:4", "10.0.0.7:5"]})


def test_workers_on_one_host_share_its_cores(monkeypatch):
    monkeypatch.delenv("STRATAX_PS_WORKER_THREADS", raising=False)
    assert compute_threads.colocated_workers(SPEC, 0) == 2   # both loopback names
    assert compute_threads.worker_threads(SPEC, 1, cores=2) == 1
    assert compute_threads.worker_threads(SPEC, 0, cores=8) == 4
    assert compute_threads.worker_threads(SPEC, 2, cores=8) is None  # alone on its host


def test_setting_overrides_and_bad_values_are_named(monkeypatch):
    monkeypatch.setenv("STRATAX_PS_WORKER_THREADS", "all")
    assert compute_threads.worker_threads(SPEC, 0, cores=2) is None
    monkeypatch.setenv("STRATAX_PS_WORKER_THREADS", "3")
    assert compute_threads.worker_threads(SPEC, 2, cores=2) == 3
    monkeypatch.setenv("STRATAX_PS_WORKER_THREADS", "0")
    with pytest.raises(ValueError, match="STRATAX_PS_WORKER_THREADS='0'"):
        compute_threads.worker_threads(SPEC, 0)


def test_limit_sets_xla_pool_size_unless_already_set(monkeypatch):
    environ = {}  # a private environment: the pool size is set process-wide otherwise
    monkeypatch.setattr(compute_threads.os, "environ", environ)
    monkeypatch.setattr(compute_threads, "host_cores", lambda: 2)
    assert compute_threads.limit_worker_threads(SPEC, 0) == 1
    assert environ["NPROC"] == "1"
    environ["NPROC"] = "2"  # the user's choice stays
    assert compute_threads.limit_worker_threads(SPEC, 0) is None
    assert environ["NPROC"] == "2"
