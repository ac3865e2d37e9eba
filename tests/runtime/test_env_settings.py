"""The runtime's numeric environment settings: default when unset, the value when valid, and
one error naming the variable, the value, what is expected and the fix when not."""

import math

import pytest

from stratax._src import startup
from stratax._src.runtime import shm_collectives, throttle


def _same(got, want):
    if want is None:
        return got is None
    return type(got) is type(want) and math.isclose(got, want)


@pytest.mark.parametrize(("read", "name", "unset", "good", "want", "bad", "error"), [
    (shm_collectives.slot_bytes, "STRATAX_SHM_SLOT_BYTES", 1 << 20,
     "1000", 960,  # rounded down to a multiple of 64
     "12x", r"STRATAX_SHM_SLOT_BYTES='12x' is not an integer >= 64 \(bytes per process slot\); "
            r"set it to an integer >= 64 or unset it for the default 1048576\."),
    (shm_collectives.slot_bytes, "STRATAX_SHM_SLOT_BYTES", 1 << 20, " 64 ", 64,
     "63", r"STRATAX_SHM_SLOT_BYTES='63' is not an integer >= 64 "),
    (shm_collectives.spin_seconds, "STRATAX_SHM_SPIN_US", 50e-6, "250", 250e-6,
     "-3", r"STRATAX_SHM_SPIN_US='-3' is not a number >= 0 \(microseconds a wait spins before "
           r"it sleeps\); set it to a number >= 0 or unset it for the default 50\."),
    (shm_collectives.spin_seconds, "STRATAX_SHM_SPIN_US", 50e-6, "0", 0.0,
     "nan", r"STRATAX_SHM_SPIN_US='nan' is not a number >= 0 "),
    (lambda: shm_collectives.spin_seconds(own_cores=True), "STRATAX_SHM_SPIN_US",
     1.0, "250", 250e-6,
     "-1", r"STRATAX_SHM_SPIN_US='-1' is not a number >= 0 .*unset it for the default 1e\+06\."),
    (throttle.cpu_window, "STRATAX_MAX_STEPS_IN_FLIGHT", throttle.DEFAULT_CPU_WINDOW,
     "0", 0,
     "-1", r"STRATAX_MAX_STEPS_IN_FLIGHT='-1' is not an integer >= 0 \(steps the host may "
           r"dispatch ahead; 0 = no bound\); set it to an integer >= 0 or unset it for the "
           r"default 2\."),
    (startup.cpu_device_count_from_env, "STRATAX_CPU_DEVICES", None, "3", 3,
     "0", r"STRATAX_CPU_DEVICES='0' is not an integer >= 1 \(CPU devices to split the host "
          r"into, one replica each\); set it to an integer >= 1 or unset it for one CPU device\."),
])
def test_setting_is_read_or_named_with_its_fix(monkeypatch, read, name, unset, good, want, bad,
                                               error):
    monkeypatch.delenv(name, raising=False)
    assert _same(read(), unset)
    monkeypatch.setenv(name, "")  # empty is unset
    assert _same(read(), unset)
    monkeypatch.setenv(name, good)
    assert _same(read(), want)
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=rf"^Environment variable {error}"):
        read()


@pytest.mark.parametrize(("affinities", "own"), [
    ([{0}, {1}], True),              # pinned to distinct cores
    ([{0, 1}, {0, 1}], True),        # unpinned, as many cores as processes
    ([{0}, {0}], False),             # pinned to the same core
    ([{0, 1}, {0, 1}, {0, 1}], False),  # more processes than cores
    ([{0}, {0, 1}], True),           # the second can run on core 1
])
def test_processes_have_own_cores_when_no_more_processes_than_cpus(affinities, own):
    assert shm_collectives.own_cores(affinities) is own
