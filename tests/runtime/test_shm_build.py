"""The shared-memory all-reduce (STRATAX_CPU_COLLECTIVES=shm) in one process: its selection,
build on first use, replication rule and error translation (tests/multiprocess has the rest)."""

import shutil

import pytest

from stratax._src.runtime import distributed, shm_build, shm_collectives


def test_shm_is_a_cpu_collectives_choice(monkeypatch):
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "SHM")
    assert distributed.cpu_collectives_from_env() == "shm"


def test_a_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("STRATAX_EXTENSION_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(shm_build.ExtensionBuildError, match="no-such-compiler"):
        shm_build.library_path()
    assert list(tmp_path.iterdir()) == []  # no half-written library left behind


@pytest.mark.skipif(shm_build.compiler() is None, reason="no C++ compiler on this machine")
def test_built_once_per_source_and_jaxlib(monkeypatch, tmp_path):
    cache = tmp_path / "cache"
    monkeypatch.setenv("STRATAX_EXTENSION_CACHE", str(cache))
    monkeypatch.delenv("CXX", raising=False)
    first = shm_build.library_path()
    assert first.parent == cache and first.stat().st_size > 0
    assert [p.name for p in cache.iterdir()] == [first.name]
    mtime = first.stat().st_mtime_ns
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))  # a rebuild would fail
    assert shm_build.library_path() == first and first.stat().st_mtime_ns == mtime
    shutil.rmtree(cache)


def test_the_shm_all_reduce_makes_values_uniform_across_replicas():
    import jax
    import numpy as np

    from stratax._src.runtime import invariance

    def body(x):
        return shm_collectives.all_reduce("sum", [x])[0], x * 2

    jaxpr = jax.make_jaxpr(body)(np.ones(3, np.float32))
    assert invariance.varying_outputs(jaxpr, [True], "replica") == [False, True]


@pytest.mark.parametrize("problem", ["exited", "did not reach all-reduce round 7 within 3 s"])
def test_a_failed_shm_all_reduce_names_the_worker(monkeypatch, problem):
    monkeypatch.setattr(distributed.runtime, "task_names", {1: "worker 1 (127.0.0.1:5)"})
    error = RuntimeError(f"ABORTED: stratax shared-memory all-reduce (process 0): process 1 "
                         f"(pid 42) {problem}. Check that process's log; the job cannot continue.")
    with pytest.raises(distributed.WorkerUnavailableError,
                       match=rf"worker 1 \(127.0.0.1:5\) \(pid 42\) {problem}\. Restart"):
        distributed.translate_collective_errors(lambda: (_ for _ in ()).throw(error))


def test_only_call_drops_the_effect_that_blocks_jax_fast_dispatch():
    """fit's packed step (one shm call per program) is dispatched on JAX's C++ fast path only
    when its custom call carries no JAX effect; every other caller keeps XLA's ordering."""
    import jax
    import numpy as np

    x = np.ones(4, np.float32)
    ordered = jax.make_jaxpr(lambda v: shm_collectives.all_reduce("sum", [v]))(x)
    only = jax.make_jaxpr(lambda v: shm_collectives.all_reduce("sum", [v], only_call=True))(x)
    assert ordered.effects and not only.effects
