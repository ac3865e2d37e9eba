"""process_layout: chief+workers, workers only, local mode and the tasks that have no layout."""

from __future__ import annotations

import pytest

from stratax._src.cluster.process_layout import ProcessLayout, process_layout
from stratax._src.cluster.simple import SimpleClusterResolver

CHIEF_WORKERS_PS = {
    "chief": ["c:1"],
    "worker": ["w0:1", "w1:1", "w2:1"],
    "ps": ["p0:1", "p1:1"],
    "evaluator": ["e:1"],
}


@pytest.mark.parametrize(
    "task_type, task_id, process_id",
    [("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2), ("worker", 2, 3)],
)
def test_chief_then_workers(task_type: str, task_id: int, process_id: int) -> None:
    resolver = SimpleClusterResolver(CHIEF_WORKERS_PS, task_type=task_type, task_id=task_id)
    layout = process_layout(resolver)
    assert layout == ProcessLayout("c:1", 4, process_id, task_type, task_id)
    assert layout.is_coordinator == (process_id == 0)
    assert not layout.is_local


@pytest.mark.parametrize("task_id", [0, 1, 2])
def test_workers_only_coordinator_is_worker_0(task_id: int) -> None:
    resolver = SimpleClusterResolver({"worker": ["w0:1", "w1:1", "w2:1"]}, task_type="worker",
                                     task_id=task_id)
    assert process_layout(resolver) == ProcessLayout("w0:1", 3, task_id, "worker", task_id)


def test_sparse_workers_keep_index_order() -> None:
    resolver = SimpleClusterResolver({"worker": {5: "w5:1", 2: "w2:1"}}, task_type="worker",
                                     task_id=5)
    assert process_layout(resolver) == ProcessLayout("w2:1", 2, 1, "worker", 5)


def test_local_mode() -> None:
    layout = process_layout(SimpleClusterResolver({}))
    assert layout == ProcessLayout(None, 1, 0, None, None)
    assert layout.is_local and layout.is_coordinator


@pytest.mark.parametrize("task_type", ["ps", "evaluator"])
def test_ps_and_evaluator_have_no_layout(task_type: str) -> None:
    resolver = SimpleClusterResolver(CHIEF_WORKERS_PS, task_type=task_type, task_id=0)
    with pytest.raises(ValueError, match=rf"This process is a '{task_type}' task, which takes no "
                                         r"part in synchronous multi-worker training"):
        process_layout(resolver)


@pytest.mark.parametrize(
    "cluster, task_type, task_id, message",
    [
        (CHIEF_WORKERS_PS, None, None, r"this process' task is unknown.*\"task\": \{\"type\""),
        (CHIEF_WORKERS_PS, "worker", None, r"task_id=None"),
        ({"trainer": ["t:1"], "worker": ["w:1"]}, "trainer", 0,
         r"Task type 'trainer' is not part of synchronous training"),
        ({"chief": ["c0:1", "c1:1"], "worker": ["w:1"]}, "worker", 0,
         r"has 2 'chief' tasks .* at most one chief"),
        ({"ps": ["p:1"]}, "chief", 0, r"has no 'chief' or 'worker' task"),
        (CHIEF_WORKERS_PS, "worker", 9,
         r"This process is worker\[9\], which is not in the cluster"),
    ],
)
def test_layout_errors(cluster: dict, task_type: str | None, task_id: int | None,
                       message: str) -> None:
    resolver = SimpleClusterResolver(cluster, task_type=task_type, task_id=task_id)
    with pytest.raises(ValueError, match=message):
        process_layout(resolver)
