"""End to end in a real browser: ``stratax launch --nproc-per-node 2 --dashboard`` on a tiny
MultiWorkerMirrored program, the page opened in headless Chromium while it trains.

Chromium is Debian's ``chromium`` package; when it is missing the test installs it with
``apt-get`` (as root), or skips saying why. The page is read with Chromium's own
``--dump-dom`` (after ``--virtual-time-budget`` lets the page's polling run) and
``--screenshot``: no DevTools client library needed. The screenshot is saved as
``benchmarks/results/dashboard.png``.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).parent / "programs" / "observed_program.py"
SCREENSHOT = REPO_ROOT / "benchmarks" / "results" / "dashboard.png"
INSTALL_TIMEOUT_S = 600
BROWSER_TIMEOUT_S = 60
DATA_TIMEOUT_S = 120


def _chromium() -> str:
    """Path of Chromium, installed from Debian's packages when missing (root only)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and this user cannot apt-get install it; run "
                    "`apt-get update && apt-get install -y chromium` as root")
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]):
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=INSTALL_TIMEOUT_S,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        except subprocess.TimeoutExpired:
            pytest.skip(f"`{' '.join(command)}` did not finish within {INSTALL_TIMEOUT_S} s")
        if done.returncode != 0:
            pytest.skip(f"`{' '.join(command)}` failed ({done.returncode}): "
                        f"{done.stderr.strip()[-300:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get installed chromium but no `chromium` command is on PATH")
    return found


def _browser(chromium: str, *args: str) -> str:
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--virtual-time-budget=4000", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)
    if done.returncode != 0:
        raise AssertionError(f"chromium exited {done.returncode}: {done.stderr[-500:]}")
    return done.stdout


def _rows(dom: str) -> dict[str, list[str]]:
    """Per-worker table rows of the page: task -> cell texts."""
    rows = {}
    for task, cells in re.findall(r'<tr[^>]*data-task="([^"]+)"[^>]*>(.*?)</tr>', dom):
        rows[task] = re.findall(r"<td>(.*?)</td>", cells)
    return rows


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_reports(run_dir: Path, launcher: subprocess.Popen, count: int) -> None:
    deadline = time.monotonic() + DATA_TIMEOUT_S
    files = [run_dir / "metrics" / f"worker_{i}.jsonl" for i in range(2)]
    while time.monotonic() < deadline:
        if all(f.exists() and f.read_text().count('"step_s"') >= count for f in files):
            return
        if launcher.poll() is not None:
            raise AssertionError(f"stratax launch ended early with {launcher.returncode}")
        time.sleep(0.2)
    raise AssertionError(f"the workers wrote no {count} reports to {run_dir} within "
                         f"{DATA_TIMEOUT_S} s")


def _check_tensorboard_equals_reports(tb_train: Path, reports: Path) -> None:
    """The chief's TensorBoard ``epoch_loss`` equals the epoch losses WorkerMetrics reported."""
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="reading TensorBoard events needs the tensorboard package")
    acc = accumulator.EventAccumulator(str(tb_train), size_guidance={accumulator.SCALARS: 0})
    acc.Reload()
    written = [(e.step, e.value) for e in acc.Scalars("epoch_loss")]
    epochs = [json.loads(line) for line in reports.read_text().splitlines()]
    reported = [(r["epoch"], r["loss"]) for r in epochs if r.get("epoch_end")]
    assert len(written) == len(reported) >= 2
    for (step, value), (epoch, loss) in zip(written, reported, strict=True):
        assert step == epoch and value == pytest.approx(loss, rel=1e-6)


@pytest.mark.slow  # ~15 s of training workers; the page in Chromium: the next test (saved run)
def test_live_dashboard_of_two_workers_in_chromium(tmp_path):
    chromium = _chromium()
    run_dir, stop_file, tb_dir = tmp_path / "run", tmp_path / "stop", tmp_path / "tb"
    port = _free_port()
    log = open(tmp_path / "launch.log", "w")  # noqa: SIM115 - closed in finally
    launcher = subprocess.Popen(
        [sys.executable, "-m", "stratax._src.cli", "launch", "--nproc-per-node", "2",
         "--dashboard", "--dashboard-port", str(port), "--run-dir", str(run_dir),
         "--timeout", "240", str(PROGRAM), str(stop_file), "500", str(tb_dir)],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_for_reports(run_dir, launcher, count=2)
        first = _browser(chromium, "--dump-dom", url)
        rows = _rows(first)
        assert set(rows) == {"worker_0", "worker_1"}, first[-2000:]
        assert first.count('class="uplot') >= 4  # uPlot charts drawn
        assert "start (start 0): worker_0, worker_1" in first
        time.sleep(1.5)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        _browser(chromium, "--window-size=1400,1750", f"--screenshot={SCREENSHOT}", url)
        later = _rows(_browser(chromium, "--dump-dom", url))
        steps = {task: int(cells[1]) for task, cells in rows.items()}
        later_steps = {task: int(cells[1]) for task, cells in later.items()}
        assert all(later_steps[t] > steps[t] for t in steps), (steps, later_steps)
        for cells in later.values():
            assert float(cells[2]) > 0 and float(cells[3]) > 0  # step time, samples/s
            assert cells[5].endswith("%")  # all-reduce share (estimated)
        assert SCREENSHOT.stat().st_size > 20_000

        stop_file.touch()
        assert launcher.wait(timeout=90) == 0, (tmp_path / "launch.log").read_text()[-3000:]
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        assert [e["kind"] for e in events] == ["start", "end"] and events[-1]["exit_code"] == 0
        # TensorBoard in a 2-worker run: only the chief wrote, the values of its History.
        assert len(list((tb_dir / "train").glob("events.out.tfevents.*"))) == 1
        _check_tensorboard_equals_reports(tb_dir / "train", run_dir / "metrics" / "worker_0.jsonl")
    finally:
        _stop(launcher)
        log.close()


def _stop(launcher: subprocess.Popen) -> None:
    """Stops the launcher's process group if it still runs (SIGTERM, then SIGKILL)."""
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGTERM)
        try:
            launcher.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=10)


@pytest.mark.slow  # two starts of 2 training workers (~40 s), then the page in Chromium
def test_a_run_resumed_by_backup_and_restore_continues_its_steps(tmp_path):
    """The issue's run, for real: worker 1 is killed at step 50 of 96 (32 steps per epoch,
    backups every 20), ``--max-restarts 1`` resumes the group from the backup. The second
    start numbers its reports from the step the backup restored, up to 96; the page shows the
    run recovered, the table at step 96, the step chart's restart marker at the resumed step."""
    from stratax._src.observe.server import DashboardServer

    chromium = _chromium()
    run_dir, tb_dir, backup = tmp_path / "run", tmp_path / "tb", tmp_path / "backup"
    log = open(tmp_path / "launch.log", "w")  # noqa: SIM115 - closed in finally
    launcher = subprocess.Popen(
        [sys.executable, "-m", "stratax._src.cli", "launch", "--nproc-per-node", "2",
         "--max-restarts", "1", "--run-dir", str(run_dir), "--timeout", "200", str(PROGRAM),
         str(tmp_path / "never"), "3", str(tb_dir), str(backup), "50"],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert launcher.wait(timeout=240) == 0, (tmp_path / "launch.log").read_text()[-3000:]
    finally:
        _stop(launcher)
        log.close()
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["start", "failure", "restart", "start", "end"]
    second_start = events[3]["t"]
    for task in ("worker_0", "worker_1"):
        records = [json.loads(line) for line in
                   (run_dir / "metrics" / f"{task}.jsonl").read_text().splitlines()]
        first = [r for r in records if r["t"] < second_start]
        resumed = [r for r in records if r["t"] >= second_start]
        begin = resumed[0]
        assert begin.get("fit_begin") == 1, resumed[:3]
        # The backup of step 40 (or of step 20, had its write not finished before the kill).
        assert begin["step"] in (20, 40) and begin["epoch"] == begin["step"] // 32
        assert max(r["step"] for r in first) >= begin["step"]
        steps = [r["step"] for r in resumed if "step_s" in r]
        assert steps and steps[0] > begin["step"] and steps == sorted(steps)
        assert resumed[-1]["step"] == 96 and resumed[-1].get("epoch_end") == 1
    with DashboardServer(run_dir) as server:
        dom = _browser(chromium, "--dump-dom", server.url)
    assert _status(dom) == ("ended", "ended, recovered from 1 restart")
    assert {cells[1] for cells in _rows(dom).values()} == {"96"}
    assert _chart_marks(dom, "chart-loss-step") == [float(begin["step"])]


def test_saved_run_shows_straggler_failure_cause_and_server_load(tmp_path):
    """A finished run's directory: the straggler row is highlighted, the failure shows its
    root cause (the failing worker's last lines), parameter-server shards their load."""
    from stratax._src.observe import record as record_mod
    from stratax._src.observe.events import EventLog
    from stratax._src.observe.server import DashboardServer

    chromium = _chromium()
    for step in (10, 20, 30):
        record_mod.record(step=step, run_dir=tmp_path, task="worker_0", step_s=0.010,
                          samples_per_s=3200, loss=1.0 / step, pull_s=0.001, push_s=0.002)
        record_mod.record(step=step, run_dir=tmp_path, task="worker_1", step_s=0.020,
                          samples_per_s=1600, loss=1.0 / step, pull_s=0.001, push_s=0.002)
        record_mod.record(run_dir=tmp_path, task="ps_0", requests_per_s=40.0 * step,
                          bytes_per_s=2e6)
    record_mod.close_all()
    log = EventLog(tmp_path)
    log.append("start", restart=0, tasks=["worker_0", "worker_1"], pids=[11, 12])
    log.failure(restart=0, task="worker_1", pid=12, returncode=-9,
                message="worker 1 (local rank 1, pid 12) failed with signal SIGKILL",
                tail=["epoch 3", "Killed by the OOM killer"])
    log.append("end", exit_code=137, message="stratax launch: worker 1 failed")
    with DashboardServer(tmp_path) as server:
        dom = _browser(chromium, "--dump-dom", server.url)
    assert re.search(r'<tr class="straggler" data-task="worker_1">', dom)
    assert not re.search(r'<tr class="straggler" data-task="worker_0">', dom)
    assert "failed with signal SIGKILL" in dom and "Killed by the OOM killer" in dom
    assert "failed (exit 137)" in dom
    rows = _rows(dom)
    assert rows["worker_0"][5] == "30.0 %"  # (pull 1 ms + push 2 ms) / step 10 ms
    ps_rows = re.findall(r"<tr><td>ps_0</td><td>([^<]*)</td><td>([^<]*)</td>", dom)
    assert ps_rows == [("1200.0", "2.00")]
    assert dom.count('class="uplot') >= 5  # ps load chart too


# A chained traceback longer than the launcher's summary quotes (40 lines): 2 x 25 frames.
TRACEBACK = ["Traceback (most recent call last):",
             *(f'  File "train.py", line {i}, in f{i}\n    return f{i + 1}()'
               for i in range(25)),
             "ValueError: bad batch", "",
             "The above exception was the direct cause of the following exception:", "",
             "Traceback (most recent call last):",
             *(f'  File "keras.py", line {i}, in g{i}\n    return g{i + 1}()'
               for i in range(25)),
             "RuntimeError: training failed"]


def _outcome_run(run_dir: Path, *, restarted: bool | str, exit_code: int | None,
                 failed: bool) -> None:
    """A run directory: one worker, 6 reports per start (the second start resumed from step 40
    of a backup: its first record is ``fit_begin`` at step 40), then the end with ``exit_code``
    (``None``: no end, a live run) after a failure with a whole traceback when ``failed``; a
    restarted run whose second start has not reported when ``restarted == "waiting"``."""
    from stratax._src.observe import record as record_mod
    from stratax._src.observe.events import EventLog

    def report(steps: range, first_loss: float) -> None:
        for step in steps:
            record_mod.record(step=step, run_dir=run_dir, task="worker_0", step_s=0.01,
                              samples_per_s=250_000.0, loss=first_loss - step / 100)
        record_mod.close_all()

    log = EventLog(run_dir)
    log.append("start", restart=0, tasks=["worker_0"], pids=[11])
    report(range(10, 70, 10), 2.0)
    if restarted:
        log.failure(restart=0, task="worker_0", pid=11, returncode=-9,
                    message="worker 0 (local rank 0, pid 11) failed with signal SIGKILL",
                    tail=["epoch 2", "Killed"])
        log.append("restart", restart=1, message="restart 1 of 3")
        if restarted == "waiting":
            return
        time.sleep(0.05)
        log.append("start", restart=1, tasks=["worker_0"], pids=[12])
        record_mod.record(step=40, run_dir=run_dir, task="worker_0", epoch=2, fit_begin=1)
        report(range(50, 110, 10), 1.8)
    if failed:
        log.failure(restart=int(bool(restarted)), task="worker_0", pid=12, returncode=1,
                    message="worker 0 (local rank 0, pid 12) exited with code 1",
                    tail=[*TRACEBACK[-18:], "shutting down"], traceback=TRACEBACK)
    if exit_code is not None:
        summary = (f"stratax launch: exit {exit_code}" if exit_code else
                   "stratax launch: all 1 worker(s) exited with code 0 (1 restart(s)).")
        log.append("end", exit_code=exit_code,
                   message=summary + "\nFull log: logs/worker_0.log")


def _pre(dom: str, cls: str, inside: str = "") -> list[str]:
    """The texts of ``<pre class=cls>`` elements (within the element whose id is ``inside``)."""
    if inside:
        found = re.search(rf'id="{inside}".*?</(section|ol)>', dom, re.S)
        dom = found.group(0) if found else ""
    return [html.unescape(text) for text in re.findall(rf'<pre class="{cls}">(.*?)</pre>', dom,
                                                        re.S)]


def _status(dom: str) -> tuple[str, str]:
    status = re.search(r'<span id="status" class="status (\w+)">([^<]*)</span>', dom)
    assert status, dom[:3000]
    return status.groups()


def _chart_marks(dom: str, chart: str) -> list[float]:
    found = re.search(rf'id="{chart}" data-restarts="([^"]*)"', dom)
    assert found, dom[:3000]
    return [float(x) for x in found.group(1).split()]


@pytest.mark.parametrize("outcome", ["finished", "recovered", "restarted-then-failed",
                                     "restarted-then-timed-out", "preempted"])
def test_the_page_shows_how_the_run_ended(tmp_path, outcome):
    """The end of a run on the page (and a screenshot of it): success; a recovery from a
    restart (not a failure; the failure kept in the journal); a failure with its whole
    traceback; a timeout after a restart (not blamed on the failure restarted from); a
    preemption. A restart is drawn as its own dashed line, the legend saying which
    start is which style, steps continuing from where the backup resumed."""
    from stratax._src.observe.server import DashboardServer

    chromium = _chromium()
    run_dir = tmp_path / "run"
    restarted = outcome.startswith(("recovered", "restarted"))
    failed = outcome == "restarted-then-failed"
    exit_code = {"finished": 0, "recovered": 0, "restarted-then-failed": 1,
                 "restarted-then-timed-out": 124, "preempted": 42}[outcome]
    _outcome_run(run_dir, restarted=restarted, exit_code=exit_code, failed=failed)
    screenshot = tmp_path / f"{outcome}.png"
    with DashboardServer(run_dir) as server:
        dom = _browser(chromium, "--dump-dom", server.url)
        _browser(chromium, "--window-size=1400,2400", f"--screenshot={screenshot}", server.url)
        assert server.serve_until_seen(0.0)  # the page received the end
    status = _status(dom)
    # The end's summary in the journal: whole, its lines kept.
    assert "Full log: logs/worker_0.log" in _pre(dom, "message", inside="events")[-1]
    if outcome == "finished":
        assert status == ("ended", "ended")
        assert '<section id="outcome" hidden="">' in dom
    elif outcome == "preempted":
        assert status == ("failed", "preempted (exit 42): stratax launch: exit 42")
    elif outcome == "restarted-then-timed-out":
        assert status == ("failed", "failed (exit 124): stratax launch: exit 124")
        assert '<section id="outcome" hidden="">' in dom
    elif outcome == "recovered":
        assert status == ("ended", "ended, recovered from 1 restart")
        assert '<section id="outcome" hidden="">' in dom
        assert "failed with signal SIGKILL" in dom  # the failure stays in the journal
    else:
        assert status == (
            "failed", "failed (exit 1): worker 0 (local rank 0, pid 12) exited with code 1")
        # The whole traceback, both exceptions and every frame, with its newlines, in the end
        # panel and in the journal; then the output printed after it.
        whole = "\n".join(TRACEBACK)
        assert _pre(dom, "traceback", inside="outcome") == [whole]
        assert _pre(dom, "traceback", inside="events") == [whole]
        assert _pre(dom, "tail", inside="outcome") == ["shutting down"]
    if restarted:
        # Steps continue across the restart: the table ends at the last step trained (100),
        # the marker on "loss vs step" sits where the second start resumed (step 40).
        assert _rows(dom)["worker_0"][1] == "100"
        assert _chart_marks(dom, "chart-loss-step") == [40.0]
        assert len(_chart_marks(dom, "chart-throughput")) == 1
        legend = re.findall(r'<div class="u-label">([^<]*)</div>', dom)
        assert {"worker_0 (start 0, solid)", "worker_0 (start 1, dashed)"} <= set(legend)
        assert re.search(r'<p class="note" id="restart-key">', dom)
    else:
        assert '<p class="note" id="restart-key" hidden="">' in dom
        assert "worker_0 (start" not in dom
    assert "run ended" in dom and "not answering" not in dom
    assert screenshot.stat().st_size > 20_000


def test_a_restart_is_marked_before_the_new_start_reports(tmp_path):
    """Live, between the launcher's restart and the new start's first report: the restart is
    on every chart already (on time charts at the restart, on the step chart after the last
    step reached), the page still live."""
    from stratax._src.observe.server import DashboardServer

    chromium = _chromium()
    run_dir = tmp_path / "run"
    _outcome_run(run_dir, restarted="waiting", exit_code=None, failed=False)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    records = [json.loads(line)
               for line in (run_dir / "metrics" / "worker_0.jsonl").read_text().splitlines()]
    restart_at = events[-1]["t"] - min(r["t"] for r in records)
    with DashboardServer(run_dir) as server:
        dom = _browser(chromium, "--dump-dom", server.url)
    assert _status(dom) == ("live", "live")
    assert _chart_marks(dom, "chart-loss-step") == [60.0]
    assert _chart_marks(dom, "chart-throughput") == [pytest.approx(restart_at, abs=1e-3)]
    assert re.search(r'<p class="note" id="restart-key">', dom)


def test_a_page_that_lost_its_server_says_disconnected(tmp_path):
    """The server stops answering mid-run (after the page's first poll): the badge turns from
    live to disconnected and the last report's age counts on, marked stale."""
    from stratax._src.observe.server import DashboardServer

    class DiesAfterFirstPoll(DashboardServer):
        polls = 0

        def data(self, since):
            self.polls += 1
            if self.polls > 1:  # the socket closes without an answer: the fetch fails
                raise ConnectionAbortedError("the dashboard server went away")
            return super().data(since)

    chromium = _chromium()
    run_dir = tmp_path / "run"
    _outcome_run(run_dir, restarted=False, exit_code=None, failed=False)
    with DiesAfterFirstPoll(run_dir) as server:
        dom = _browser(chromium, "--dump-dom", server.url)
    assert server.polls >= 2
    assert _status(dom) == ("disconnected", "disconnected")
    assert "dashboard server not answering since" in dom
    age = re.search(r'<td class="stale" title="[^"]*">([\d.]+) s ago</td>', dom)
    assert age and float(age.group(1)) >= 1.0, dom[:3000]  # it counted on after the last poll
