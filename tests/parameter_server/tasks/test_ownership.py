"""Chief sessions without a cluster: claims, refusals, take-over and the chief timeout."""

import time
import types

import pytest

from stratax._src.parameter_server.tasks import ownership
from stratax._src.parameter_server.tasks.ownership import ChiefWatch, SessionError
from stratax._src.parameter_server.transport import wire


def _claim(watch, session):
    return wire.decode(watch.claim(wire.Frame({"method": "session", "session": session},
                                              []))).meta


def test_chief_timeout_resolves_argument_then_environment(monkeypatch):
    monkeypatch.setenv("STRATAX_PS_CHIEF_TIMEOUT_SECONDS", "7")
    assert ownership.resolve_chief_timeout(30) == 30.0
    assert ownership.resolve_chief_timeout() == 7.0
    monkeypatch.delenv("STRATAX_PS_CHIEF_TIMEOUT_SECONDS")
    assert ownership.resolve_chief_timeout() == 120.0
    with pytest.raises(ValueError, match=r"chief_timeout_seconds must be a number >= 3, got 1"):
        ownership.resolve_chief_timeout(1)
    monkeypatch.setenv("STRATAX_PS_CHIEF_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ValueError, match="STRATAX_PS_CHIEF_TIMEOUT_SECONDS"):
        ownership.resolve_chief_timeout()


def test_a_live_owner_keeps_the_task_and_a_quiet_one_is_replaced(monkeypatch):
    resets = []
    watch = ChiefWatch("ps 0", 60, lambda: resets.append(1))
    a, b = "hostA-11-" + "a" * 32, "hostB-22-" + "b" * 32
    first = _claim(watch, a)
    assert first["took_over"] is False and resets == []
    watch.check({"method": "pull", "session": a})
    with pytest.raises(SessionError, match=r"ps 0 is owned by another chief \(the chief on "
                                           r"host hostA, pid 11, heard") as refused:
        _claim(watch, b)
    assert a not in str(refused.value) and "a" * 32 not in str(refused.value)
    with pytest.raises(SessionError, match="refused 'pull': it belongs to another chief") as late:
        watch.check({"method": "pull", "session": b})
    assert a not in str(late.value) and b not in str(late.value)
    monkeypatch.setattr(ownership, "LIVE_SECONDS", 0.05)
    time.sleep(0.1)
    second = _claim(watch, b)                         # A went quiet: B takes over, state reset
    assert second["took_over"] is True and resets == [1]
    assert second["incarnation"] == first["incarnation"]
    with pytest.raises(SessionError, match="this chief was replaced"):
        watch.check({"method": "pull", "session": a})  # the replaced chief's late calls


@pytest.mark.parametrize("quiet, taken_over", [(4.9, False), (5.1, True)])
def test_a_new_chief_takes_over_after_5_s_of_the_old_ones_silence(monkeypatch, quiet,
                                                                   taken_over):
    """docs/parameter_server.md, Failures: a new chief takes the tasks over after 5 s of the
    old chief's silence, not before (a clock of the test's, no sleeping)."""
    now = [1000.0]
    monkeypatch.setattr(ownership, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    watch = ChiefWatch("ps 0", 60, lambda: None)
    _claim(watch, "hostA-11-" + "a" * 32)
    now[0] += quiet
    if taken_over:
        assert _claim(watch, "hostB-22-" + "b" * 32)["took_over"] is True
    else:
        with pytest.raises(SessionError, match=r"is owned by another chief .*heard 4\.9 s ago"):
            _claim(watch, "hostB-22-" + "b" * 32)


@pytest.mark.parametrize("meta", [{}, {"session": None}, {"session": ""}, {"session": 7},
                                  {"session": "x" * 257}])
def test_a_call_without_a_session_is_refused_claimed_or_not(meta):
    watch = ChiefWatch("ps 0", 60, lambda: None)
    with pytest.raises(SessionError, match="refused 'assign': the call carries no chief session"):
        watch.check({"method": "assign", **meta})
    _claim(watch, "A")
    with pytest.raises(SessionError, match="carries no chief session"):
        watch.check({"method": "assign", **meta})


def test_an_unclaimed_task_serves_any_session():
    watch = ChiefWatch("ps 0", 60, lambda: None)
    watch.check({"session": "A"})                     # a restarted ps before the heartbeat


def test_a_replaced_session_keeps_nothing_alive(monkeypatch):
    """A's heartbeats (late, or replayed) after B took over neither reclaim the task nor count
    as a chief heard: with B gone too, the task gives up after its chief timeout."""
    monkeypatch.setattr(ownership, "LIVE_SECONDS", 0.05)
    watch = ChiefWatch("worker 0", 0.6, lambda: None)
    _claim(watch, "A")
    time.sleep(0.1)
    _claim(watch, "B")                                # A quiet: B takes over; A is retired
    watch.start()
    try:
        end = time.monotonic() + 3.0
        while not watch.lost.is_set() and time.monotonic() < end:
            with pytest.raises(SessionError, match="taken over by another chief session"):
                _claim(watch, "A")                    # B is quiet by now, and still refused
            time.sleep(0.05)
        assert watch.lost.is_set()
    finally:
        watch.stop()


def test_no_chief_for_the_timeout_sets_lost():
    watch = ChiefWatch("worker 0", 0.3, lambda: None)
    watch.start()
    try:
        assert watch.lost.wait(2.0)
    finally:
        watch.stop()
