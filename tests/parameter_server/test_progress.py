"""The coordinator's progress line and records: per-worker steps/s, the slowest worker named."""

import io
import json

import pytest
from cluster_helpers import cluster  # noqa: F401 - `cluster` is a fixture

from stratax._src.observe.reader import RunReader
from stratax._src.parameter_server import progress


class _Counters:
    """Cumulative per-worker counters, advanced by hand between reports."""

    def __init__(self, names):
        self.values = {n: {"steps": 0, "wall": 0.0, "pull": 0.0, "data": 0.0, "push": 0.0}
                       for n in names}
        self.alive = dict.fromkeys(names, True)

    def add(self, name, steps, wall, pull=0.0):
        c = self.values[name]
        c["steps"] += steps
        c["wall"] += wall
        c["pull"] += pull

    def read(self):
        return {n: (self.alive[n], dict(c)) for n, c in self.values.items()}


def _reporter(counters, tmp_path, sync=False, pending=True):
    stream = io.StringIO()
    ticks = iter(range(100))  # each report closes a window of 1 s
    reporter = progress.ProgressReporter(counters.read, lambda: pending, sync=sync,
                                         every_seconds=0, run_dir=tmp_path, stream=stream,
                                         clock=lambda: float(next(ticks)))
    return reporter, stream


def test_async_slowest_worker_is_named_in_line_and_records(tmp_path):
    counters = _Counters(["worker 0", "worker 1", "worker 2"])
    reporter, stream = _reporter(counters, tmp_path)
    assert reporter.report() is None                       # nothing ran: no line
    counters.add("worker 0", 100, 1.0)
    counters.add("worker 1", 95, 1.0)
    counters.add("worker 2", 20, 1.0)                      # 50 ms/step vs ~10 ms/step
    window = reporter.report()
    assert window.slowest.name == "worker 2" and window.slowest.straggler
    assert window.slowest.slow_factor == pytest.approx(0.05 / ((0.01 + 1 / 95) / 2))
    line = stream.getvalue()
    assert "worker 2:" in line and "<- slowest, straggler" in line.split("worker 2:")[1]
    counters.add("worker 0", 100, 1.0)
    counters.add("worker 1", 90, 1.0)
    counters.add("worker 2", 80, 1.0)                      # no longer 1.5x slower
    window = reporter.report()
    assert window.slowest.name == "worker 2" and not window.slowest.straggler
    reporter.stop()
    records = [json.loads(x) for x in (tmp_path / "metrics" / "worker_2.jsonl").open()]
    assert [r["straggler"] for r in records] == [1, 0]
    assert [r["slowest"] for r in records] == [1, 1]
    assert records[0]["task"] == "worker_2" and records[0]["step"] == 20
    assert records[1]["step_s"] == pytest.approx(1 / 80)
    fast = [json.loads(x) for x in (tmp_path / "metrics" / "worker_0.jsonl").open()]
    assert [r["slowest"] for r in fast] == [0, 0]
    tasks = RunReader(tmp_path).snapshot()["tasks"]           # what the dashboard shows
    assert sorted(tasks) == ["worker_0", "worker_1", "worker_2"]
    assert tasks["worker_2"]["straggler"] and not tasks["worker_0"]["straggler"]


@pytest.mark.parametrize("slower, straggler", [(1.49, False), (1.51, True), (3.0, True)])
def test_a_straggler_is_at_least_1_5x_the_median_of_the_others(tmp_path, slower, straggler):
    """docs/parameter_server.md's rule, at its edge: 1.5x the others' median step time."""
    counters = _Counters(["worker 0", "worker 1", "worker 2", "worker 3"])
    reporter, _ = _reporter(counters, tmp_path)
    counters.add("worker 0", 100, 0.9)
    counters.add("worker 1", 100, 1.0)                     # the others' median: 10 ms/step
    counters.add("worker 2", 100, 1.1)
    counters.add("worker 3", 100, slower)
    window = reporter.report()
    assert window.slowest.name == "worker 3"
    assert window.slowest.slow_factor == pytest.approx(slower)
    assert window.slowest.straggler is straggler
    reporter.stop()


def test_sync_leaves_out_the_wait_in_pull(tmp_path):
    # Every worker runs every step; the fast ones wait for worker 1 inside their pull.
    counters = _Counters(["worker 0", "worker 1"])
    reporter, _ = _reporter(counters, tmp_path, sync=True)
    counters.add("worker 0", 10, 1.0, pull=0.8)
    counters.add("worker 1", 10, 1.0, pull=0.05)
    window = reporter.report()
    assert window.slowest.name == "worker 1" and window.slowest.straggler
    assert window.workers[0].steps_per_s == window.workers[1].steps_per_s


def test_a_worker_without_steps_while_work_waits_is_slowest(tmp_path):
    counters = _Counters(["worker 0", "worker 1"])
    reporter, stream = _reporter(counters, tmp_path)
    counters.add("worker 0", 50, 0.5)
    window = reporter.report()
    assert window.slowest.name == "worker 1" and window.slowest.straggler
    counters.alive["worker 1"] = False
    counters.add("worker 0", 50, 0.5)
    assert reporter.report().slowest is None              # one live worker: nobody to compare
    assert "worker 1: dead" in stream.getvalue()


@pytest.mark.parametrize("value", [-1, "x", True])
def test_bad_period_is_named(value):
    with pytest.raises(ValueError, match="progress period"):
        progress.resolve_every_seconds(value)


def test_period_from_the_environment(monkeypatch):
    monkeypatch.delenv("STRATAX_PS_PROGRESS_SECONDS", raising=False)
    assert progress.resolve_every_seconds() == progress.DEFAULT_EVERY_SECONDS
    monkeypatch.setenv("STRATAX_PS_PROGRESS_SECONDS", "0")
    assert progress.resolve_every_seconds() == 0.0
    assert progress.resolve_every_seconds(2) == 2.0
    monkeypatch.setenv("STRATAX_PS_PROGRESS_SECONDS", "soon")
    with pytest.raises(ValueError, match=r"STRATAX_PS_PROGRESS_SECONDS='soon' is not a number "
                                         r">= 0 \(seconds between progress lines; 0 = off\)"):
        progress.resolve_every_seconds()


WINDOW_SECONDS = 0.5  # straggler_program.py's progress_seconds


@pytest.mark.timeout(120)
def test_slowed_worker_is_reported_as_the_straggler(cluster, tmp_path):  # noqa: F811 - fixture
    run_dir = tmp_path / "run"
    cluster.start("straggler_program.py", {"chief": 1, "worker": 2, "ps": 1}, args=(str(run_dir),))
    code, out = cluster.wait("chief0", timeout=90)
    assert code == 0, out[-4000:]
    result = cluster.result()
    assert result["slowest"] == "worker 1" and result["straggler"], result
    assert "worker 1:" in out and "<- slowest, straggler" in out
    records = {w: [json.loads(x) for x in (run_dir / "metrics" / f"{w}.jsonl").open()]
               for w in ("worker_0", "worker_1")}
    # Every window wholly inside the timed phase names worker 1 (one preempted window on a
    # loaded box is tolerated); the compile window and the last one at shutdown are left out.
    start, end = result["timed"]
    inside = {w: [r for r in rs if start + WINDOW_SECONDS <= r["t"] <= end]
              for w, rs in records.items()}
    assert len(inside["worker_1"]) >= 2, records
    assert sum(r["straggler"] for r in inside["worker_1"]) >= len(inside["worker_1"]) - 1, records
    assert sum(r["slowest"] for r in inside["worker_0"]) <= 1, records
