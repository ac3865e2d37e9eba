"""Choosing the CPU collectives between processes, and the address gloo binds to."""

import pytest

from stratax._src.cluster.process_layout import ProcessLayout
from stratax._src.core.config import config
from stratax._src.runtime import cpu_collectives, distributed, shm_collectives


def test_auto_is_the_default_and_gloo_a_choice(monkeypatch):
    monkeypatch.delenv("STRATAX_CPU_COLLECTIVES", raising=False)
    assert cpu_collectives.resolve() == "auto"
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "Auto")
    assert cpu_collectives.resolve() == "auto"
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", " GLOO ")
    assert cpu_collectives.resolve() == "gloo"


def test_unknown_implementation_is_named(monkeypatch):
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "nccl")
    with pytest.raises(ValueError, match=r"STRATAX_CPU_COLLECTIVES='nccl'.*auto, gloo, mpi, shm"):
        cpu_collectives.resolve()


def test_mpi_needs_mpitrampoline(monkeypatch):
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "mpi")
    monkeypatch.delenv("MPITRAMPOLINE_LIB", raising=False)
    with pytest.raises(ValueError, match="MPITRAMPOLINE_LIB"):
        cpu_collectives.resolve()
    monkeypatch.setenv("MPITRAMPOLINE_LIB", "/opt/mpiwrapper/lib/libmpiwrapper.so")
    assert cpu_collectives.resolve() == "mpi"


def test_errors_name_the_setting_that_chose_the_collectives(monkeypatch):
    """CommunicationOptions(implementation=...), sx.config or the variable: an error about the
    choice names the one the user wrote, and how to undo it."""
    monkeypatch.delenv("STRATAX_CPU_COLLECTIVES", raising=False)
    monkeypatch.delenv("MPITRAMPOLINE_LIB", raising=False)
    assert cpu_collectives.setting("shm") == shm_collectives.Setting(
        "CommunicationOptions(implementation='shm')",
        "pass CommunicationOptions(implementation='auto')")
    with pytest.raises(ValueError, match=r"^CommunicationOptions\(implementation='mpi'\) needs "
                                         r"MPITRAMPOLINE_LIB.*pass CommunicationOptions\("
                                         r"implementation='auto'\) for gloo\.$"):
        cpu_collectives.resolve("mpi")
    config.update("cpu_collectives", "shm")
    try:
        assert cpu_collectives.setting() == shm_collectives.Setting(
            "sx.config cpu_collectives='shm'", "call sx.config.update('cpu_collectives', 'auto')")
    finally:
        config.reset("cpu_collectives")
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "shm")
    assert cpu_collectives.setting() == shm_collectives.Setting(
        "STRATAX_CPU_COLLECTIVES=shm", "unset STRATAX_CPU_COLLECTIVES")
    with pytest.raises(ValueError, match=r"^STRATAX_CPU_COLLECTIVES=mpi needs"):
        monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "mpi")
        cpu_collectives.resolve()


def test_local_address_towards_loopback_is_loopback():
    assert distributed.local_address_towards("127.0.0.1") == "127.0.0.1"


@pytest.mark.parametrize(
    "coordinator, process_id, expected",
    [
        ("node0:29501", 0, "node0"),           # the coordinator's own host, as written
        ("node0:29501", 3, "10.0.0.7"),        # another node: its address towards node0
        ("localhost:29501", 3, "localhost"),   # loopback: every process is on that machine
        ("[::1]:29501", 1, "::1"),
    ],
)
def test_advertised_host(monkeypatch, coordinator, process_id, expected):
    """What each process publishes for the cluster spec once the group formed (issue 49 #4)."""
    monkeypatch.setattr(distributed, "local_address_towards",
                        lambda host: {"node0": "10.0.0.7"}[host])
    layout = ProcessLayout(coordinator, 4, process_id, "worker", process_id)
    assert distributed.advertised_host(layout) == expected
