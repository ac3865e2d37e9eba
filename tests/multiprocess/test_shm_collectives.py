"""STRATAX_CPU_COLLECTIVES=shm: the same-host shared-memory all-reduce between real processes.

It must give what gloo gives (bit for bit), train as one process does, fail within the timeout
naming a peer that stalls or dies, and leave no segment in /dev/shm.
"""

import json
import os
import re
import time

import numpy as np
import pytest
from conftest import assert_same_weights, load_weights, worker_cluster
from test_multi_worker import _reference

from stratax._src.runtime import shm_build

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shm"),
              pytest.mark.skipif(shm_build.compiler() is None,
                                 reason="no C++ compiler: shm falls back to gloo")]


def _configs():
    cluster = worker_cluster(2)
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})
            for i in range(2)], cluster


def _run(workers, args, transport, timeout=200, **extra):
    configs, cluster = _configs()
    chosen = {"STRATAX_CPU_COLLECTIVES": transport} if transport else {}  # None: unset (auto)
    workers.start(args, configs, extra_env={**chosen, **extra})
    outputs = workers.wait(timeout=timeout)
    return outputs, cluster


def _segment(output):
    return re.search(r"^segment (\S+)$", output, re.M).group(1)


def test_all_reduce_over_shm_equals_gloo_bit_for_bit(workers, tmp_path):
    """SUM/MEAN/MAX/MIN of f32, f64, i32 and a tensor larger than a slot (chunked); f16 (not
    handled by shm) still goes through gloo in the same step."""
    (tmp_path / "shm").mkdir()
    (tmp_path / "gloo").mkdir()
    outputs, _ = _run(workers, ["shm_program.py", str(tmp_path / "shm"), "reduce"], "shm",
                      STRATAX_SHM_SLOT_BYTES="65536")
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    for output in outputs:
        assert "shm True" in output and "traced 6" in output, output[-2000:]
        assert "order mismatches 0" in output
        # One all-reduce is no JAX effect (C++ dispatch); with four, the effect orders them.
        assert "effects of one all-reduce []" in output, output[-2000:]
        assert "effects of four ['FfiEffect']" in output, output[-2000:]
        assert "named after the set-up False" in output
        assert not os.path.exists("/dev/shm" + _segment(output))
    workers.kill_all()
    workers.procs.clear()
    outputs, _ = _run(workers, ["shm_program.py", str(tmp_path / "gloo"), "reduce"], "gloo")
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    assert "traced 0" in outputs[0] and "order mismatches 0" in outputs[0]
    with np.load(tmp_path / "gloo" / "reduce_0.npz") as gloo:
        for worker in (0, 1):
            with np.load(tmp_path / "shm" / f"reduce_{worker}.npz") as shm:
                assert sorted(shm.files) == sorted(gloo.files)
                for key in gloo.files:
                    np.testing.assert_array_equal(shm[key], gloo[key], err_msg=key)


def test_all_gather_and_reduce_scatter_over_shm(workers, tmp_path):
    """The collectives of fit's sharded update: operands that share a round and ones larger
    than a slot (64 KiB here), f32, f64 and i32, exact against numpy."""
    outputs, _ = _run(workers, ["shm_program.py", str(tmp_path), "gather"], "shm",
                      STRATAX_SHM_SLOT_BYTES="65536")
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    for worker, output in enumerate(outputs):
        assert "gather mismatches 0" in output and "scatter mismatches 0" in output, \
            output[-2000:]
        assert f"done {worker}" in output


_AUTO_SHM = "CPU collectives: gloo plus the shared-memory all-reduce for packed all-reduces (auto"


def _auto(workers, tmp_path, **extra):
    outputs, cluster = _run(workers, ["shm_program.py", str(tmp_path), "once"], None, **extra)
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    workers.kill_all()
    workers.procs.clear()
    return outputs, cluster


def test_auto_picks_shm_on_one_host_and_gloo_otherwise_and_says_why(workers, tmp_path):
    """STRATAX_CPU_COLLECTIVES unset: shm for one CPU device per process on one host; gloo, with
    no error, for two devices per process or when the library cannot be built."""
    outputs, _ = _auto(workers, tmp_path)
    # Two processes with this process's CPUs: a core each if there are two (waits spin up to 1 s).
    spin = "1e+06" if len(os.sched_getaffinity(0)) >= 2 else "50"
    for output in outputs:
        assert "shm True" in output and "traced 4" in output  # one per op, output[-2000:]
        assert output.count(_AUTO_SHM) == 1, output[-2000:]
        assert f"waits spin up to {spin} us" in output, output[-2000:]
        assert "idle threads 1" in output, output[-2000:]  # gloo's I/O thread (gloo_io)
    outputs, cluster = _auto(workers, tmp_path, STRATAX_CPU_DEVICES="2",
                             STRATAX_GLOO_IO_PRIORITY="normal")
    for output in outputs:
        assert "shm False" in output and "traced 0" in output, output[-2000:]
        assert "idle threads 0" in output, output[-2000:]
        assert output.count("CPU collectives: gloo (auto: no shared-memory all-reduce because "
                            f"worker 0 ({cluster['worker'][0]}) it has 2 local cpu device(s)"
                            ) == 1, output[-2000:]
    (tmp_path / "empty_cache").mkdir()
    outputs, _ = _auto(workers, tmp_path, CXX="/bin/false",
                       STRATAX_EXTENSION_CACHE=str(tmp_path / "empty_cache"))
    for output in outputs:
        assert "shm False" in output and "traced 0" in output, output[-2000:]
        # Each process tried (one after the other, under the build lock) and says so, then
        # every process falls back with one warning line.
        warnings = [line for line in output.splitlines() if line.startswith("WARNING")]
        assert len(warnings) == 2, output[-2000:]
        assert warnings[0].startswith("WARNING stratax._src.runtime.shm_build: building the "
                                      "shared-memory all-reduce (one time"), output[-2000:]
        assert re.fullmatch(
            r"WARNING stratax._src.runtime.shm_collectives: CPU collectives: gloo \(auto: "
            r"worker \d \(.+\) could not build the shared-memory all-reduce: compiling "
            r"shm_allreduce.cc with /bin/false failed \(exit 1\); "
            r"STRATAX_CPU_COLLECTIVES=shm shows the whole error, =gloo silences this\)",
            warnings[1]), output[-2000:]


@pytest.mark.parametrize(("variable", "implementation", "configured", "ops"), [
    ("shm", "gloo", "-", "CrossDeviceOps"),  # the argument wins over the variable
    ("gloo", "-", "shm", "SharedMemoryAllReduce"),  # sx.config wins over the variable
])
def test_the_transport_is_the_argument_then_sx_config_then_the_variable(
        workers, variable, implementation, configured, ops):
    outputs, _ = _run(workers, ["transport_choice_program.py", implementation, configured],
                      variable)
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    shared = ops == "SharedMemoryAllReduce"
    for output in outputs:
        assert f"ops {ops}" in output and f"shm {shared}" in output, output[-2000:]
        assert "sum 3.0" in output and f"traced {int(shared)}" in output, output[-2000:]


def test_a_dev_shm_too_small_falls_back_to_gloo_at_set_up(workers, tmp_path):
    """A container-sized /dev/shm (here 1 MiB, below the 2 x 1 MiB slots): the segment cannot
    be reserved, so auto uses gloo everywhere and says why; the all-reduces still work."""
    outputs, cluster = _run(workers, ["small_shm.py", "shm_program.py", str(tmp_path), "once"],
                            None)
    if any(p.returncode == 77 for p in workers.procs):
        pytest.skip("cannot make a mount namespace with its own /dev/shm: " + outputs[0][-300:])
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    for worker, output in enumerate(outputs):
        assert "shm False" in output and "traced 0" in output, output[-2000:]
        assert f"done {worker}" in output, output[-2000:]
        assert re.search(
            r"CPU collectives: gloo \(auto: no shared-memory all-reduce because "
            rf"worker 0 \({re.escape(cluster['worker'][0])}\) could not create the "
            r"shared-memory segment: reserving \d+ bytes in /dev/shm failed: No space left",
            output), output[-2000:]


def test_fit_over_shm_equals_one_process(workers, tmp_path):
    outputs, _ = _run(workers, ["mwms_program.py", str(tmp_path), "2"], "shm")
    assert [p.returncode for p in workers.procs] == [0, 0], outputs[0][-3000:]
    for worker, output in enumerate(outputs):
        assert f"done {worker} 2" in output
        traced = int(re.search(r"shm all-reduces traced (\d+)", output).group(1))
        assert traced >= 1, output[-2000:]  # the packed step went through shared memory
    w0, w1 = (load_weights(tmp_path / f"arrays_weights_{i}.npz") for i in (0, 1))
    assert_same_weights(w0, w1)
    assert_same_weights(w0, _reference()[0], tol=1e-5)


def _failure(workers, tmp_path, mode, timeout):
    configs, _ = _configs()
    workers.start(["shm_program.py", str(tmp_path), mode, str(timeout)], configs,
                  extra_env={"STRATAX_CPU_COLLECTIVES": "shm"})
    out, _ = workers.procs[0].communicate(timeout=120)
    assert "error after" in out, out[-3000:]
    return float(re.search(r"error after ([\d.]+) s", out).group(1)), out


def test_stalled_peer_is_named_within_the_timeout(workers, tmp_path):
    seconds, out = _failure(workers, tmp_path, "stall", 3)
    assert 2.5 < seconds < 10, out[-2000:]
    assert "process 1 (pid" in out and "did not reach all-reduce round 1 within 3 s" in out


def test_dead_peer_is_named_at_once(workers, tmp_path):
    """SIGKILL of worker 1 (not reaped yet: a zombie) while worker 0 waits in the all-reduce."""
    seconds, out = _failure(workers, tmp_path, "die", 20)
    pid = workers.procs[1].pid
    assert f"process 1 (pid {pid}) exited" in out, out[-2000:]
    assert seconds < 5, out[-2000:]


@pytest.mark.slow
def test_peer_killed_mid_fit_is_named(workers):
    """Worker 1 is killed (SIGKILL) mid-fit: worker 0 fails, naming it (the shared-memory wait
    or gloo, whichever notices first)."""
    start = time.monotonic()
    outputs, cluster = _run(workers, ["mwms_peer_death.py", "15"], "shm")
    assert workers.procs[1].returncode == -9
    assert workers.procs[0].returncode != 0
    assert "WorkerUnavailableError" in outputs[0], outputs[0][-3000:]
    assert f"worker 1 ({cluster['worker'][1]})" in outputs[0]
    assert time.monotonic() - start < 120


def test_several_devices_per_process_is_an_error_on_every_worker(workers, tmp_path):
    outputs, cluster = _run(workers, ["mwms_program.py", str(tmp_path), "1"], "shm",
                            STRATAX_CPU_DEVICES="2")
    assert [p.returncode != 0 for p in workers.procs] == [True, True]
    for output in outputs:
        assert ("STRATAX_CPU_COLLECTIVES=shm cannot be used: worker 0 "
                f"({cluster['worker'][0]}) it has 2 local cpu device(s)") in output, output[-2000:]
