"""Choosing the CPU collectives between processes, and the address gloo binds to."""

import pytest

from stratax._src.runtime import cpu_collectives, distributed


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


def test_local_address_towards_loopback_is_loopback():
    assert distributed.local_address_towards("127.0.0.1") == "127.0.0.1"
