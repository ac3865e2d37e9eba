"""Test set-up: 8 forced CPU devices (before JAX starts) and hygiene checks for every test.

Tier (ii) tests need several replicas in one process, so the CPU is split into 8 XLA devices
before anything imports JAX. Every test fails if it leaks environment variables, ``sx.config``
options, non-daemon threads or child processes (Lightning's test hygiene).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading

os.environ.setdefault("STRATAX_CPU_DEVICES", "8")
os.environ["KERAS_BACKEND"] = "jax"
# Many tests compile the same programs: the same small model in many tests, the same step in
# every worker process of a job and again after a restart. One XLA compilation cache for this
# session and the processes it starts compiles each once (test_input_matrix.py: 47 s against
# 72). JAX still traces and lowers every program, so tests that count compilations ("Compiling
# jit(...)") see the same count. The cache is new for every session, removed at its end.
os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="stratax-tests-xla-cache-")
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
# Processes the tests start skip Keras' optional matplotlib and IPython imports (~1 s each).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child_startup"),
     *filter(None, [os.environ.get("PYTHONPATH")])])

# Importing Keras sets TF_FORCE_GPU_ALLOW_GROWTH, and TensorFlow (installed by the test extra
# for the input tests) sets TF2_BEHAVIOR and more when Keras first asks whether it is there (as
# plain Keras' fit on arrays does): import both before any test, so the hygiene check below
# does not blame the first test that happens to touch them.
import importlib.util

import keras  # noqa: F401
import pytest

if importlib.util.find_spec("tensorflow") is not None:  # absent at the other end of the range
    import tensorflow  # noqa: F401

import stratax  # noqa: F401  (applies STRATAX_CPU_DEVICES before JAX starts)
from stratax._src.core.config import config

atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

NUM_TEST_DEVICES = int(os.environ["STRATAX_CPU_DEVICES"])


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry))
    return found


@pytest.fixture(autouse=True)
def _hygiene():
    env_before = dict(os.environ)
    threads_before = {t for t in threading.enumerate() if not t.daemon}
    children_before = _children(os.getpid())
    yield
    problems = []
    env_after = dict(os.environ)
    changed = {
        k for k in env_before.keys() | env_after.keys()
        if env_before.get(k) != env_after.get(k) and k != "PYTEST_CURRENT_TEST"
    }
    if changed:
        problems.append(f"environment variables leaked: {sorted(changed)}")
        for key in changed:
            if key in env_before:
                os.environ[key] = env_before[key]
            else:
                os.environ.pop(key, None)
    updated = config.updates()
    if updated:
        problems.append(f"sx.config options left set: {sorted(updated)}")
        config.reset()
    leaked_threads = [
        t for t in threading.enumerate()
        if not t.daemon and t.is_alive() and t not in threads_before
    ]
    for thread in leaked_threads:
        thread.join(timeout=5)
    leaked_threads = [t.name for t in leaked_threads if t.is_alive()]
    if leaked_threads:
        problems.append(f"threads leaked: {leaked_threads}")
    leaked_children = _children(os.getpid()) - children_before
    if leaked_children:
        problems.append(f"child processes leaked: {sorted(leaked_children)}")
    if problems:
        pytest.fail("; ".join(problems))


@pytest.fixture
def two_hosts():
    """Two "hosts": fresh network namespaces joined by a veth pair
    (``benchmarks/cluster/netns.py``: 10.213.x.1 <-> .2, nothing routed elsewhere), with
    unique names; removed afterwards. Skipped, with the reason, where namespaces cannot be made
    (it needs root for ``ip netns``)."""
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "cluster" / "netns.py"
    spec = importlib.util.spec_from_file_location("_stratax_netns", path)
    netns = sys.modules.setdefault("_stratax_netns", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(netns)
    tag = os.getpid() % 200 + 20
    bed = netns.TestBed((f"sxa{os.getpid()}", f"sxb{os.getpid()}"),
                        (f"10.213.{tag}.1", f"10.213.{tag}.2"))
    try:
        bed.up()
    except netns.NetnsUnavailable as error:
        pytest.skip(f"cannot make network namespaces here: {error}")
    yield bed
    bed.down()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in bed.names), listed
