"""Chief sessions without a cluster: claims, refusals, take-over and the chief timeout."""

import time

import pytest

from stratax._src.parameter_server.tasks import chief_session
from stratax._src.parameter_server.tasks.chief_session import ChiefWatch, SessionError
from stratax._src.parameter_server.transport import wire


def _claim(watch, session):
    return wire.decode(watch.claim(wire.Frame({"method": "session", "session": session},
                                              []))).meta


def test_chief_timeout_resolves_argument_then_environment(monkeypatch):
    monkeypatch.setenv("STRATAX_PS_CHIEF_TIMEOUT_SECONDS", "7")
    assert chief_session.resolve_chief_timeout(30) == 30.0
    assert chief_session.resolve_chief_timeout() == 7.0
    monkeypatch.delenv("STRATAX_PS_CHIEF_TIMEOUT_SECONDS")
    assert chief_session.resolve_chief_timeout() == 120.0
    with pytest.raises(ValueError, match=r"chief_timeout_seconds must be a number >= 3, got 1"):
        chief_session.resolve_chief_timeout(1)
    monkeypatch.setenv("STRATAX_PS_CHIEF_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ValueError, match="STRATAX_PS_CHIEF_TIMEOUT_SECONDS"):
        chief_session.resolve_chief_timeout()


def test_a_live_owner_keeps_the_task_and_a_quiet_one_is_replaced(monkeypatch):
    resets = []
    watch = ChiefWatch("ps 0", 60, lambda: resets.append(1))
    first = _claim(watch, "A")
    assert first["took_over"] is False and resets == []
    watch.check({"session": "A"})
    watch.check({})                                   # calls without a session pass
    with pytest.raises(SessionError, match=r"ps 0 is owned by another chief \(session A"):
        _claim(watch, "B")
    with pytest.raises(SessionError, match="belongs to chief session A, not to 'B'"):
        watch.check({"session": "B"})
    monkeypatch.setattr(chief_session, "LIVE_SECONDS", 0.05)
    time.sleep(0.1)
    second = _claim(watch, "B")                       # A went quiet: B takes over, state reset
    assert second["took_over"] is True and resets == [1]
    assert second["incarnation"] == first["incarnation"]
    with pytest.raises(SessionError, match="this chief was replaced"):
        watch.check({"session": "A"})                 # the replaced chief's late calls


def test_an_unclaimed_task_serves_any_session():
    watch = ChiefWatch("ps 0", 60, lambda: None)
    watch.check({"session": "A"})                     # a restarted ps before the heartbeat


def test_no_chief_for_the_timeout_sets_lost():
    watch = ChiefWatch("worker 0", 0.3, lambda: None)
    watch.start()
    try:
        assert watch.lost.wait(2.0)
    finally:
        watch.stop()
