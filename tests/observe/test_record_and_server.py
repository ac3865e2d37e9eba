"""Metrics intake (``record``), launcher events, the run-directory reader and the web server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from stratax._src.core import env as env_names
from stratax._src.observe import record as record_mod
from stratax._src.observe.events import EventLog
from stratax._src.observe.reader import RunReader, find_straggler
from stratax._src.observe.run_dir import resolve_task_name
from stratax._src.observe.server import DashboardServer, is_loopback


@pytest.fixture(autouse=True)
def _close_writers():
    yield
    record_mod.close_all()


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_record_appends_json_lines_per_task(tmp_path):
    assert record_mod.record(step=1, run_dir=tmp_path, task="worker_0", loss=0.5, step_s=0.01)
    assert record_mod.record(step=2, run_dir=tmp_path, task="worker_0", loss=float("nan"))
    assert record_mod.record(run_dir=tmp_path, task="ps_1", requests_per_s=12)
    lines = (tmp_path / "metrics" / "worker_0.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)
    assert (first["step"], first["loss"], first["step_s"], first["task"]) == (1, 0.5, 0.01,
                                                                               "worker_0")
    assert second["loss"] is None  # non-finite becomes null, JSON stays valid
    assert json.loads((tmp_path / "metrics" / "ps_1.jsonl").read_text())["requests_per_s"] == 12


def test_record_without_run_dir_is_off(monkeypatch):
    monkeypatch.delenv(env_names.STRATAX_RUN_DIR, raising=False)
    assert record_mod.record(step=1, loss=1.0) is False


def test_record_uses_env_run_dir_and_launcher_rank(tmp_path, monkeypatch):
    monkeypatch.setenv(env_names.STRATAX_RUN_DIR, str(tmp_path))
    monkeypatch.setenv(env_names.STRATAX_PROCESS_ID, "3")
    monkeypatch.delenv(env_names.STRATAX_TASK_NAME, raising=False)
    assert record_mod.record(step=7, loss=0.1)
    assert json.loads((tmp_path / "metrics" / "worker_3.jsonl").read_text())["step"] == 7


def test_task_name_from_tf_config(monkeypatch):
    monkeypatch.delenv(env_names.STRATAX_PROCESS_ID, raising=False)
    monkeypatch.delenv(env_names.STRATAX_TASK_NAME, raising=False)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {}, "task": {"type": "ps",
                                                                          "index": 1}}))
    assert resolve_task_name() == "ps_1"


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "x" * 65])
def test_bad_task_name_is_an_error(tmp_path, bad):
    with pytest.raises(ValueError, match="not usable as a file name"):
        record_mod.record(step=1, run_dir=tmp_path, task=bad, loss=1.0)


def test_bad_values_are_errors(tmp_path):
    with pytest.raises(TypeError, match="'loss' must be a number, got 'high'"):
        record_mod.record(step=1, run_dir=tmp_path, task="w", loss="high")
    with pytest.raises(ValueError, match="'t' is reserved"):
        record_mod.record(step=1, run_dir=tmp_path, task="w", t=1.0)


def test_reader_tails_complete_lines_and_flags_straggler(tmp_path):
    record_mod.record(step=1, run_dir=tmp_path, task="worker_0", step_s=0.010)
    record_mod.record(step=1, run_dir=tmp_path, task="worker_1", step_s=0.010)
    reader = RunReader(tmp_path)
    first = reader.snapshot(0)
    assert first["seq"] == 2 and not any(t["straggler"] for t in first["tasks"].values())
    # A half-written line is not read until it is complete.
    with open(tmp_path / "metrics" / "worker_1.jsonl", "a") as f:
        f.write('{"t": 1, "task": "worker_1", "step": 2, "step_s": 0.0')
    assert reader.snapshot(2)["records"] == []
    with open(tmp_path / "metrics" / "worker_1.jsonl", "a") as f:
        f.write('30}\n')
    later = reader.snapshot(2)
    assert [r["step"] for r in later["records"]] == [2]
    assert later["tasks"]["worker_1"]["straggler"] and not later["tasks"]["worker_0"]["straggler"]


def test_straggler_needs_a_clear_gap():
    assert find_straggler({"a": {"step_s": 1.0}, "b": {"step_s": 1.02}}) is None
    assert find_straggler({"a": {"step_s": 1.0}, "b": {"step_s": 1.5}}) == "b"
    assert find_straggler({"a": {"step_s": 1.0}, "ps_0": {"requests_per_s": 5}}) is None
    # Synchronous workers step together (2.70 vs 2.35 ms is noise): the one whose input wait
    # holds the others up in the all-reduce is named, by a gap of 5% of the step.
    sync = {"synchronous": 1}
    assert find_straggler({"a": {"step_s": 2.70e-3, "input_s": 1e-4, **sync},
                           "b": {"step_s": 2.35e-3, "input_s": 1e-4, **sync}}) is None
    assert find_straggler({"a": {"step_s": 10e-3, "input_s": 0.1e-3, **sync},
                           "b": {"step_s": 10e-3, "input_s": 4e-3, **sync}}) == "b"
    assert find_straggler({"a": {"step_s": 10e-3, "input_s": 0.1e-3, **sync},
                           "b": {"step_s": 10e-3, "input_s": 0.4e-3, **sync}}) is None


def test_event_log_round_trip(tmp_path):
    log = EventLog(tmp_path)
    log.append("start", restart=0, tasks=["worker_0"], pids=[1])
    log.failure(restart=0, task="worker_0", pid=1, returncode=-9, message="killed",
                tail=["a", "b"])
    with pytest.raises(ValueError, match="Unknown event kind 'boom'"):
        log.append("boom")
    events = RunReader(tmp_path).snapshot()["events"]
    assert [e["kind"] for e in events] == ["start", "failure"]
    assert events[1]["tail"] == ["a", "b"]


def test_server_serves_page_static_files_and_data(tmp_path):
    record_mod.record(step=5, run_dir=tmp_path, task="worker_0", loss=0.2)
    with DashboardServer(tmp_path) as server:
        assert server.url.startswith("http://127.0.0.1:") and server.token is None
        status, page = _get(server.url)
        assert status == 200 and b"uPlot.iife.min.js" in page
        status, lib = _get(server.url + "static/uPlot.iife.min.js")
        assert status == 200 and len(lib) > 40_000
        status, body = _get(server.url + "api/data?since=0")
        data = json.loads(body)
        assert data["tasks"]["worker_0"]["loss"] == 0.2 and data["seq"] == 1
        assert _get(server.url + "static/../server.py")[0] == 404
        assert _get(server.url + "api/data?since=x")[0] == 400


def test_loopback_server_answers_only_requests_addressed_to_it(tmp_path):
    """No token on loopback: a page of another site that rebinds its name to 127.0.0.1 sends
    its own name as Host, and is refused."""
    with DashboardServer(tmp_path) as server:
        for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}"):
            assert _get(server.url + "api/data", {"Host": host})[0] == 200
        for host in (f"evil.example:{server.port}", "localhost:1", ""):
            status, body = _get(server.url + "api/data", {"Host": host})
            assert status == 421 and b"open the URL the dashboard printed" in body, host
        assert _get(server.url + "favicon.ico")[0] == 204


def test_server_stays_until_a_watching_page_has_the_end(tmp_path):
    """After the run: serve on until a polling page received the end event (bounded), and not
    at all when no page is watching."""
    import threading
    import time

    with DashboardServer(tmp_path) as server:
        assert server.serve_until_seen(30.0) is False  # nobody polled: no wait
    log = EventLog(tmp_path)
    log.append("start", restart=0, tasks=["worker_0"], pids=[1])
    with DashboardServer(tmp_path) as server:
        _get(server.url + "api/data?since=0")  # a page is watching the live run
        started = time.monotonic()
        assert server.serve_until_seen(0.3) is False  # no end yet: the grace period bounds it
        assert 0.3 <= time.monotonic() - started < 5
        log.append("end", exit_code=1, message="worker 0 failed")
        poller = threading.Timer(0.2, _get, [server.url + "api/data?since=0"])
        poller.start()
        started = time.monotonic()
        assert server.serve_until_seen(30.0) is True
        assert time.monotonic() - started < 10
        poller.join(timeout=10)


def test_non_loopback_server_requires_token(tmp_path, monkeypatch):
    monkeypatch.delenv(env_names.STRATAX_DASHBOARD_TOKEN, raising=False)
    with DashboardServer(tmp_path, host="0.0.0.0") as server:
        assert server.token and f"?token={server.token}" in server.url
        base = f"http://127.0.0.1:{server.port}/"
        assert _get(base)[0] == 401
        assert _get(base + "api/data")[0] == 401
        assert _get(base + "api/data?token=wrong-token-wrong-token")[0] == 401
        assert _get(base + f"api/data?token={server.token}")[0] == 200
        assert _get(base + "api/data", {"Authorization": f"Bearer {server.token}"})[0] == 200
        assert _get(base + "static/uPlot.iife.min.js")[0] == 200  # library code is public


def test_server_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="at least 16 characters"):
        DashboardServer(tmp_path, host="0.0.0.0", token="short")
    with pytest.raises(ValueError, match=r"port must be an int in 0\.\.65535"):
        DashboardServer(tmp_path, port=70000)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")
