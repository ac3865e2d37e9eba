"""The shared-memory all-reduce (STRATAX_CPU_COLLECTIVES=shm) in one process: its selection,
build on first use (once per machine, under a lock), the fallback or error when it cannot be
built, replication rule and error translation (tests/multiprocess has the rest)."""

import fcntl
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from stratax._src.runtime import cpu_collectives, distributed, shm_build, shm_calls, shm_collectives

HAVE_COMPILER = shm_build.compiler() is not None

# A stand-in compiler for the lock test: counts its runs, then holds the build until the test
# creates `release` (60 s at most), then writes a placeholder library where `-o` says.
FAKE_COMPILER = textwrap.dedent("""\
    #!/bin/sh
    here=$(dirname "$0")
    echo $$ >> "$here/runs"
    i=0
    while [ ! -e "$here/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    while [ $# -gt 0 ]; do
      if [ "$1" = -o ]; then printf placeholder > "$2"; fi
      shift
    done
    exit 0
""")

BUILD = textwrap.dedent("""\
    import logging, sys
    if sys.argv[1] == "info":
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    from stratax._src.runtime import shm_build
    print(shm_build.library_path())
""")


def test_shm_is_a_cpu_collectives_choice(monkeypatch):
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "SHM")
    assert cpu_collectives.resolve() == "shm"


def test_a_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("STRATAX_EXTENSION_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(shm_build.ExtensionBuildError, match="no-such-compiler"):
        shm_build.library_path()
    # No half-written library left behind (only the lock file, reused by the next build).
    assert [p.name for p in tmp_path.iterdir()] == [shm_build.library_file().stem + ".lock"]
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++ or c++ on it
    with pytest.raises(shm_build.ExtensionBuildError,
                       match=r"no C\+\+ compiler .*set CXX, or install g\+\+"):
        shm_build.library_path()


@pytest.mark.parametrize("where", ["/proc/stratax-cache", "a file"])
def test_a_cache_directory_that_cannot_be_written_is_a_build_error(monkeypatch, tmp_path, where):
    """The issue's crash (FileNotFoundError, exit 1): now a build error that names the
    directory and the variable to set. /proc refuses even root; so does a path under a file."""
    cache = where if where.startswith("/") else str(tmp_path / "file" / "cache")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("STRATAX_EXTENSION_CACHE", cache)
    monkeypatch.setenv("CXX", "/bin/false")  # never reached
    with pytest.raises(shm_build.ExtensionBuildError,
                       match=rf"^cannot write its cache directory {re.escape(cache)} \(.+\); "
                             "set STRATAX_EXTENSION_CACHE to a writable directory$"):
        shm_build.library_path()


class _OneProcessClient:
    """The coordination service's key-value store, for a job of one process."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def key_value_set(self, key: str, value: str) -> None:
        self.values[key] = value

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
        return self.values[key]


@pytest.fixture
def one_process_setup(monkeypatch):
    """``shm_collectives.setup`` of a one-process job that could use shm but for the build."""
    monkeypatch.setattr(shm_collectives.seam, "distributed_client", _OneProcessClient)
    monkeypatch.setattr(shm_collectives, "_local_problem", lambda: "")
    monkeypatch.setattr(shm_collectives.state, "library", None)
    return lambda required: shm_collectives.setup(0, 1, 5.0, lambda p: f"worker {p}",
                                                  required=required)


@pytest.mark.parametrize("cause", ["cache", "no compiler", "compiler error"])
def test_auto_falls_back_to_gloo_with_one_warning_line_and_shm_is_an_error(
        monkeypatch, tmp_path, caplog, one_process_setup, cause):
    """The issue's /proc cache, no compiler, and a compiler error: under auto gloo with one
    warning line that names the cause and the fix; under shm an error with the same."""
    monkeypatch.setenv("STRATAX_EXTENSION_CACHE", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    if cause == "cache":
        monkeypatch.setenv("STRATAX_EXTENSION_CACHE", "/proc/stratax-cache")
        expected = ("cannot write its cache directory /proc/stratax-cache",
                    "set STRATAX_EXTENSION_CACHE to a writable directory")
    elif cause == "no compiler":
        monkeypatch.setenv("PATH", str(tmp_path))
        expected = ("no C++ compiler", "set CXX, or install g++")
    else:
        broken = tmp_path / "broken-cxx"
        broken.write_text("#!/bin/sh\necho 'note: in this file' >&2\n"
                          "echo 'x.cc:1:1: error: no pause here' >&2\nexit 1\n")
        broken.chmod(0o755)
        monkeypatch.setenv("CXX", str(broken))
        expected = (f"compiling shm_allreduce.cc with {broken} failed (exit 1): x.cc:1:1: "
                    "error: no pause here",)
    with caplog.at_level(logging.DEBUG, logger="stratax"):
        assert one_process_setup(False) is False
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    building = [r for r in warnings if r.name == shm_build.logger.name]  # a build was tried
    assert len(building) == (cause == "compiler error")
    (warning,) = [r for r in warnings if r not in building]
    message = warning.getMessage()
    assert "\n" not in message and message.startswith(
        "CPU collectives: gloo (auto: worker 0 could not build the shared-memory all-reduce: ")
    assert all(part in message for part in expected), message
    with pytest.raises(shm_build.ExtensionBuildError) as raised:
        one_process_setup(True)
    text = str(raised.value)
    assert text.startswith("STRATAX_CPU_COLLECTIVES=shm cannot be used: worker 0 could not "
                           "build the shared-memory all-reduce: ")
    assert all(part in text for part in expected), text
    assert text.endswith("Fix that, or unset STRATAX_CPU_COLLECTIVES to fall back to gloo.")


def test_shm_asked_for_by_the_argument_is_named_in_its_error(monkeypatch, one_process_setup):
    """CommunicationOptions(implementation="shm") that cannot be had: the error names that
    argument and its undo, not the environment variable the user never set."""
    monkeypatch.delenv("STRATAX_CPU_COLLECTIVES", raising=False)
    monkeypatch.setenv("STRATAX_EXTENSION_CACHE", "/proc/stratax-cache")
    with pytest.raises(shm_build.ExtensionBuildError) as raised:
        shm_collectives.setup(0, 1, 5.0, lambda p: f"worker {p}", required=True,
                              chosen=cpu_collectives.setting("shm"))
    text = str(raised.value)
    assert text.startswith("CommunicationOptions(implementation='shm') cannot be used: worker 0 "
                           "could not build the shared-memory all-reduce: "), text
    assert text.endswith("Fix that, or pass CommunicationOptions(implementation='auto') to fall "
                         "back to gloo."), text
    assert "STRATAX_CPU_COLLECTIVES" not in text


def test_a_lock_held_too_long_is_an_error_naming_the_holder(monkeypatch, tmp_path):
    monkeypatch.setenv("STRATAX_EXTENSION_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    lock = shm_build.library_file().with_suffix(".lock")
    with open(lock, "w") as held:
        held.write("12345")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX)  # another open file: conflicts even in this process
        with pytest.raises(shm_build.ExtensionBuildError,
                           match=rf"process 12345 has been building the library for more than "
                                 rf"0.3 s \(it holds {re.escape(str(lock))}\); check that "
                                 "process, or set STRATAX_EXTENSION_CACHE to another directory"):
            shm_build.library_path(lock_timeout=0.3)


def test_processes_that_start_together_build_once(tmp_path):
    """The first process builds, saying so at the default log level; one started during its
    build waits on the lock, names the builder, and loads what it built: one compiler run."""
    compiler = tmp_path / "bin" / "fake-cxx"
    compiler.parent.mkdir()
    compiler.write_text(FAKE_COMPILER)
    compiler.chmod(0o755)
    cache = tmp_path / "cache"
    env = dict(os.environ, CXX=str(compiler), STRATAX_EXTENSION_CACHE=str(cache))
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    processes = []
    try:
        with open(logs[0], "w") as log:
            processes.append(subprocess.Popen([sys.executable, "-c", BUILD, "default"], env=env,
                                              stdout=subprocess.PIPE, stderr=log, text=True))
        _wait_for(lambda: (compiler.parent / "runs").exists(), "the first build to start")
        with open(logs[1], "w") as log:
            processes.append(subprocess.Popen([sys.executable, "-c", BUILD, "info"], env=env,
                                              stdout=subprocess.PIPE, stderr=log, text=True))
        waiting = f"waiting for process {processes[0].pid}, which builds the shared-memory"
        _wait_for(lambda: waiting in logs[1].read_text(), "the second process to wait")
        (compiler.parent / "release").touch()
        outputs = [p.communicate(timeout=60)[0] for p in processes]
    finally:
        (compiler.parent / "release").touch()  # ends a fake compiler left by a failure
        for process in processes:
            process.kill()
            process.wait()
    assert [p.returncode for p in processes] == [0, 0], [log.read_text() for log in logs]
    library = shm_build.library_file().name
    assert outputs == [f"{cache / library}\n"] * 2
    assert len((compiler.parent / "runs").read_text().split()) == 1  # one build
    assert (cache / library).read_text() == "placeholder"
    first, second = (log.read_text() for log in logs)
    assert re.fullmatch(r"building the shared-memory all-reduce \(one time, ~\d+ s\) into "
                        rf"{re.escape(str(cache))}\n", first), first
    assert "building" not in second, second


def _wait_for(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler on this machine")
def test_built_once_per_source_and_jaxlib(monkeypatch, tmp_path, caplog):
    cache = tmp_path / "cache"
    monkeypatch.setenv("STRATAX_EXTENSION_CACHE", str(cache))
    monkeypatch.delenv("CXX", raising=False)
    with caplog.at_level(logging.WARNING, logger="stratax"):
        first = shm_build.library_path()
    assert first.parent == cache and first.stat().st_size > 0
    assert sorted(p.name for p in cache.iterdir()) == [first.stem + ".lock", first.name]
    assert [r.getMessage() for r in caplog.records] == [
        f"building the shared-memory all-reduce (one time, ~6 s) into {cache}"]
    mtime = first.stat().st_mtime_ns
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))  # a rebuild would fail
    assert shm_build.library_path() == first and first.stat().st_mtime_ns == mtime
    shutil.rmtree(cache)


@pytest.mark.skipif(not HAVE_COMPILER, reason="no C++ compiler on this machine")
@pytest.mark.parametrize("cpu", ["x86", "aarch64", "other"])
def test_the_spin_wait_hint_compiles_for_each_cpu(tmp_path, cpu):
    """The source's only CPU-specific code is its spin-wait hint, and each branch of it is
    valid C++ (x86's pause, ARM's yield, nothing): no x86-only builtin breaks an ARM build.
    Checked by syntax (an ARM assembler is not here to assemble `yield`)."""
    source = shm_build.SOURCE.read_text()
    start = source.index("inline void CpuRelax() {")
    hint = source[start:source.index("\n}\n", start) + 3]
    assert "__builtin_ia32" not in source.replace(hint, "")
    assert "asm" not in source.replace(hint, "")
    unit = tmp_path / "hint.cc"
    unit.write_text(hint + "void Spin() { CpuRelax(); }\n")
    defines = {"x86": [], "aarch64": ["-U__x86_64__", "-U__i386__", "-D__aarch64__"],
               "other": ["-U__x86_64__", "-U__i386__", "-U__aarch64__"]}[cpu]
    done = subprocess.run([shm_build.compiler(), "-fsyntax-only", "-std=c++17", *defines,
                           str(unit)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_shm_all_reduce_makes_values_uniform_across_replicas():
    import jax
    import numpy as np

    from stratax._src.runtime import invariance
    from stratax._src.strategies.transport import SharedMemoryAllReduce

    def body(x):
        return shm_calls.all_reduce("sum", [x])[0], x * 2

    jaxpr = jax.make_jaxpr(body)(np.ones(3, np.float32))
    unifying = SharedMemoryAllReduce.unifying_calls  # what a strategy over shm passes
    assert invariance.varying_outputs(jaxpr, [True], "replica", unifying) == [False, True]


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
    ordered = jax.make_jaxpr(lambda v: shm_calls.all_reduce("sum", [v]))(x)
    only = jax.make_jaxpr(lambda v: shm_calls.all_reduce("sum", [v], only_call=True))(x)
    assert ordered.effects and not only.effects
