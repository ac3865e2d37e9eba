"""Failure handling: teardown of the group, root-cause summary, restarts, timeout, signals."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest

from stratax._src.launch import EXIT_TIMEOUT, launch, worker_group

# Worker 0 sleeps (with a sleeping grandchild); worker 1 fails once both are running.
FAIL_ONE = '''
if RANK == 0:
    record_pid("grandchild", spawn_sleeper().pid)
    record_pid("sleeper")
    time.sleep(60)
else:
    wait_for("sleeper.pid")
    print("worker one is about to fail")
    print("Traceback: something broke", file=sys.stderr)
    {exit}
'''


@pytest.mark.timeout(20)
def test_failing_worker_stops_sleeping_sibling_and_is_named(scripts):
    script = scripts.write("fail.py", FAIL_ONE.format(exit="sys.exit(3)"))
    threads_before = threading.active_count()
    started = time.monotonic()
    result = launch([sys.executable, script], nproc_per_node=2, stream_output=False)
    elapsed = time.monotonic() - started

    assert result.exit_code == 3 and not result.ok
    assert elapsed < 8, f"teardown took {elapsed:.1f} s"
    for name in ("sleeper", "grandchild"):
        assert scripts.wait_gone(scripts.pid(name), 3.0), f"{name} survived the teardown"
    failure = result.failure
    assert (failure.name, failure.exit_code, failure.signal_name) == ("worker 1", 3, None)
    assert "worker 1" in result.summary and "exit code 3" in result.summary
    assert "Traceback: something broke" in result.summary
    assert "worker one is about to fail" in result.summary
    assert "worker 0" not in result.summary.splitlines()[0]
    assert threading.active_count() == threads_before  # reader and waiter threads all ended


@pytest.mark.timeout(20)
def test_worker_killed_by_signal_is_reported_with_the_signal_name(scripts):
    script = scripts.write("kill.py", FAIL_ONE.format(exit="os.kill(os.getpid(), 9)"))
    result = launch([sys.executable, script], nproc_per_node=2, stream_output=False)
    assert result.exit_code == 128 + 9
    assert (result.failure.name, result.failure.signal_name) == ("worker 1", "SIGKILL")
    assert "worker 1" in result.summary and "signal SIGKILL" in result.summary
    assert scripts.wait_gone(scripts.pid("sleeper"), 3.0)


FLAKY = '''
record_pid("worker_%d_restart_%d" % (RANK, RESTART))
print("start", RESTART, flush=True)
record_pid("printed_%d_%d" % (RANK, RESTART))
if RANK == 1 and RESTART == 0:
    wait_for("printed_0_0.pid")  # worker 0's line is out before the failure tears the group down
    sys.exit(7)
'''


@pytest.mark.timeout(20)
@pytest.mark.parametrize("max_restarts, exit_code, restarts", [(1, 0, 1), (0, 7, 0)])
def test_group_restarts_after_a_failure(scripts, max_restarts, exit_code, restarts):
    script = scripts.write("flaky.py", FLAKY)
    result = launch([sys.executable, script], nproc_per_node=2, max_restarts=max_restarts,
                    stream_output=False, capture_output=True)
    assert (result.exit_code, result.restarts) == (exit_code, restarts), result.summary
    assert len(result.failures) == 1 and result.failures[0].name == "worker 1"
    assert result.outputs == {0: [f"start {restarts}"], 1: [f"start {restarts}"]}


STUCK = '''
if RANK == 1:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL after the grace period stops it
record_pid("stuck_%d" % RANK)
time.sleep(60)
'''


@pytest.mark.timeout(20)
def test_timeout_stops_the_group_even_a_worker_ignoring_sigterm(scripts):
    script = scripts.write("stuck.py", STUCK)
    started = time.monotonic()
    result = launch([sys.executable, script], nproc_per_node=2, timeout=1.5, grace_period=0.5,
                    stream_output=False)
    elapsed = time.monotonic() - started
    assert result.exit_code == EXIT_TIMEOUT and result.timed_out
    assert "timeout of 1.5 s" in result.summary
    assert 1.4 < elapsed < 6, elapsed
    for rank in (0, 1):
        assert not scripts.alive(scripts.pid(f"stuck_{rank}"))


POLITE = '''
def on_term(signum, frame):
    with open(os.path.join(OUT, "term_%d" % RANK), "w") as f:
        f.write(str(signum))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
record_pid("polite_%d" % RANK)
time.sleep(60)
'''


@pytest.mark.timeout(20)
def test_sigterm_to_launcher_is_forwarded_to_workers(scripts, run_cli):
    script = scripts.write("polite.py", POLITE)
    proc = run_cli("--nproc-per-node", "2", "--grace-period", "3", script)
    pids = [scripts.pid(f"polite_{rank}") for rank in (0, 1)]
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted by SIGTERM" in stderr
    for rank, pid in enumerate(pids):
        term = scripts.out / f"term_{rank}"
        assert term.exists(), f"worker {rank} never got SIGTERM"
        assert term.read_text() == str(int(signal.SIGTERM))  # what its handler received
        assert scripts.wait_gone(pid, 3.0)


# Worker 1 raises and then hangs (as in JAX's shutdown barrier) before it aborts; worker 0 aborts
# first because worker 1 stopped answering (as JAX's coordination service makes it do).
RAISE_THEN_PEER_ABORTS = '''
if RANK == 1:
    try:
        raise RuntimeError("the real error, on worker one")
    except RuntimeError:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
    open(os.path.join(OUT, "raised"), "w").close()
    wait_for("aborted")
    time.sleep(0.5)
    os.abort()
else:
    wait_for("raised")
    for i in range(30):
        print("F1130 client.h:80] Terminating process: another task died (noise %d)" % i,
              file=sys.stderr)
    sys.stderr.flush()
    open(os.path.join(OUT, "aborted"), "w").close()
    os.abort()
'''


@pytest.mark.timeout(20)
def test_worker_whose_traceback_came_first_is_named_not_the_first_to_abort(scripts):
    script = scripts.write("raise.py", RAISE_THEN_PEER_ABORTS)
    result = launch([sys.executable, script], nproc_per_node=2, stream_output=False)
    failure = result.failure
    assert failure is not None and failure.name == "worker 1", result.summary
    first_line, *quoted = result.summary.splitlines()
    # Worker 0 exited first (SIGABRT); worker 1, stuck after its traceback, was stopped by the
    # teardown; it is still where the failure started.
    assert first_line.startswith("stratax launch: worker 1 ") and "worker 0" not in first_line
    assert quoted[0] == "worker 1's last Python traceback:"
    assert quoted[1] == "  [worker 1] Traceback (most recent call last):"
    assert "  [worker 1] RuntimeError: the real error, on worker one" in quoted
    assert "noise" not in result.summary


# Worker 1 dies of SIGTERM; worker 0's collective notices and fails with the error that names
# the lost peer.
PEER_DIES_THEN_THE_SURVIVOR_FAILS = '''
if RANK == 1:
    wait_for("started")
    os.kill(os.getpid(), signal.SIGTERM)
record_pid("survivor")
open(os.path.join(OUT, "started"), "w").close()
wait_for("peer_is_a_zombie")
print("Traceback (most recent call last):", file=sys.stderr)
print("stratax._src.core.errors.WorkerUnavailableError: The shared-memory all-reduce failed: "
      "worker 1 exited.", file=sys.stderr)
sys.exit(1)
'''


@pytest.mark.timeout(20)
def test_a_worker_that_lost_a_peer_is_not_named_before_the_peer(scripts, monkeypatch):
    """On a loaded box the launcher may reap the killed peer only after the survivor printed
    its traceback and exited (CI saw this): the peer, not the survivor, is still named."""
    reap = worker_group.WorkerGroup._wait

    def late_reap_of_worker_1(group, worker):
        if worker.spec.name == "worker 1":
            while not _is_zombie(worker.pid):
                time.sleep(0.01)
            (scripts.out / "peer_is_a_zombie").touch()
            # Reaped after the survivor's exit was seen and the teardown began.
            while group._signalled_at is None:
                time.sleep(0.01)
        reap(group, worker)

    monkeypatch.setattr(worker_group.WorkerGroup, "_wait", late_reap_of_worker_1)
    script = scripts.write("peer.py", PEER_DIES_THEN_THE_SURVIVOR_FAILS)
    result = launch([sys.executable, script], nproc_per_node=2, stream_output=False)
    failure = result.failure
    assert failure is not None and failure.name == "worker 1", result.summary
    assert failure.signal_name == "SIGTERM" and result.exit_code == 128 + signal.SIGTERM


# Worker 0 starts printing a traceback (a peer's failure it is about to report) and is still at
# it when worker 1 dies of SIGTERM; the teardown then stops worker 0 mid-traceback.
PEER_DIES_WHILE_THE_SURVIVOR_REPORTS = '''
if RANK == 0:
    print("Traceback (most recent call last):", file=sys.stderr)
    print('  File "step.py", line 1, in all_reduce', file=sys.stderr, flush=True)
    open(os.path.join(OUT, "reporting"), "w").close()
    time.sleep(60)
wait_for("reporting")
os.kill(os.getpid(), signal.SIGTERM)
'''


@pytest.mark.timeout(20)
def test_a_worker_stopped_mid_traceback_is_not_named_before_the_peer_that_died(scripts):
    """The worker that began printing a traceback before the peer's exit was seen, and was
    stopped by the teardown before it finished, was reporting, not failing: CI saw it named."""
    script = scripts.write("reporting.py", PEER_DIES_WHILE_THE_SURVIVOR_REPORTS)
    result = launch([sys.executable, script], nproc_per_node=2, stream_output=False)
    failure = result.failure
    assert failure is not None and failure.name == "worker 1", result.summary
    assert failure.signal_name == "SIGTERM" and result.exit_code == 128 + signal.SIGTERM


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


LONG_TRACEBACK_THEN_NOISE = '''
CHAIN = "".join("def f%d():\\n    return f%d()\\n" % (i, i + 1) for i in range(50))
exec(CHAIN + "def f50():\\n    raise ValueError('bad value at the bottom')\\n")
if RANK == 1:
    try:
        f0()
    except ValueError:
        import traceback
        traceback.print_exc()
    for i in range(40):
        print("shutdown noise %d" % i, file=sys.stderr)
    sys.exit(5)
time.sleep(30)
'''


@pytest.mark.timeout(20)
def test_summary_quotes_the_traceback_even_when_noise_follows_it(scripts):
    script = scripts.write("deep.py", LONG_TRACEBACK_THEN_NOISE)
    result = launch([sys.executable, script], nproc_per_node=2, stream_output=False)
    assert result.exit_code == 5 and result.failure is not None
    lines = result.summary.splitlines()
    assert lines[1] == "worker 1's last Python traceback:"
    assert lines[2] == "  [worker 1] Traceback (most recent call last):"
    assert "line(s) left out; see the full output" in lines[3]
    assert "  [worker 1] ValueError: bad value at the bottom" in lines
    assert len(lines) <= 3 + 40 + 1


@pytest.mark.timeout(20)
def test_sigterm_to_launcher_escalates_to_sigkill_after_the_grace_period(scripts, run_cli):
    """Workers that ignore SIGTERM (as JAX's preemption notifier made them) are SIGKILLed after
    --grace-period; the launcher never waits on them."""
    script = scripts.write("stuck.py", STUCK)
    proc = run_cli("--nproc-per-node", "2", "--grace-period", "1", script)
    pids = [scripts.pid(f"stuck_{rank}") for rank in (0, 1)]
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=10)
    elapsed = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "interrupted by SIGTERM" in stderr
    assert 0.9 < elapsed < 6, elapsed
    for pid in pids:
        assert scripts.wait_gone(pid, 1.0)


# Both workers note SIGTERM and go on sleeping: only SIGKILL stops them.
DEAF = '''
def on_term(signum, frame):
    open(os.path.join(OUT, "term_%d" % RANK), "w").close()
signal.signal(signal.SIGTERM, on_term)
record_pid("deaf_%d" % RANK)
while True:
    time.sleep(60)
'''


@pytest.mark.timeout(60)
def test_a_second_signal_skips_the_rest_of_the_grace_period(scripts, run_cli):
    """docs/failures-and-signals.md: the first signal sends SIGTERM to the workers and waits
    up to --grace-period (here 40 s); a second one SIGKILLs them at once."""
    script = scripts.write("deaf.py", DEAF)
    proc = run_cli("--nproc-per-node", "2", "--grace-period", "40", script)
    pids = [scripts.pid(f"deaf_{rank}") for rank in (0, 1)]
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    while not all((scripts.out / f"term_{rank}").exists() for rank in (0, 1)):
        assert time.monotonic() < deadline and proc.poll() is None, "SIGTERM never forwarded"
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    # Within a quarter of the grace period: the launcher did not wait it out.
    assert time.monotonic() - sent < 10, stderr
    assert proc.returncode == 128 + signal.SIGTERM, stderr     # the first signal's code
    assert "interrupted by SIGTERM" in stderr
    for pid in pids:
        assert scripts.wait_gone(pid, 5.0)


# Worker 1 freezes (SIGSTOP); worker 0 is aborted the way JAX's coordination service aborts a
# process when a peer stops sending heartbeats (the gloo path), or fails with stratax's error
# naming the peer (the shared-memory path).
FROZEN_PEER = '''
if RANK == 1:
    open(os.path.join(OUT, "frozen"), "w").close()
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)
wait_for("frozen")
if {jax_abort}:
    print("F1205 client.h:80] Terminating process because the JAX distributed service detected "
          "fatal errors. absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped "
          "sending heartbeats):", file=sys.stderr)
    print("1", file=sys.stderr)
    print("The tasks have crashed.", file=sys.stderr)
    print("*** Check failure stack trace: ***", file=sys.stderr)
    sys.stderr.flush()
    os.abort()
print("Traceback (most recent call last):", file=sys.stderr)
print("stratax._src.core.errors.WorkerUnavailableError: The shared-memory all-reduce failed: "
      "worker 1 (127.0.0.1:1234) did not reach all-reduce round 21 within 10 s.", file=sys.stderr)
sys.exit(1)
'''


@pytest.mark.timeout(20)
@pytest.mark.parametrize("jax_abort", [True, False], ids=["jax-heartbeats", "stratax-error"])
def test_a_frozen_worker_is_named_not_the_peer_that_reported_it(scripts, jax_abort):
    script = scripts.write("frozen.py", FROZEN_PEER.format(jax_abort=jax_abort))
    result = launch([sys.executable, script], nproc_per_node=2, stream_output=False,
                    grace_period=2)
    failure = result.failure
    assert failure is not None and failure.name == "worker 1", result.summary
    assert failure.reported_by == "worker 0"
    first_line, said, *quoted = result.summary.splitlines()
    assert first_line.startswith("stratax launch: worker 1 ") and "stopped answering" in first_line
    # The teardown resumes a stopped worker, so SIGTERM ends it without the SIGKILL escalation.
    assert failure.signal_name == "SIGTERM", result.summary
    assert said == "What worker 0 said:"
    if jax_abort:
        assert quoted == ["  [worker 0] JAX's coordination service: The following tasks are "
                          "unhealthy (stopped sending heartbeats): 1"]
    else:
        assert "did not reach all-reduce round 21" in quoted[-1]
    assert "Check failure" not in result.summary
