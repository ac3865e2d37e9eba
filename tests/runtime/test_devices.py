"""Device names in TensorFlow's spellings, unknown devices, and the CPU-split helper."""

import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import stratax as sx
from stratax._src.runtime.devices import place, resolve_device, resolve_devices


@pytest.mark.parametrize("name", ["cpu:1", "CPU:1", "/cpu:1", "/device:CPU:1",
                                  "/job:worker/replica:0/task:0/device:CPU:1"])
def test_tensorflow_device_spellings(name):
    assert resolve_device(name) == jax.local_devices(backend="cpu")[1]


def test_jax_device_passes_through():
    device = jax.local_devices()[2]
    assert resolve_device(device) is device


def test_unknown_device_names_what_exists():
    with pytest.raises(ValueError, match="found 8 cpu device"):
        resolve_device("cpu:99")
    with pytest.raises(ValueError, match="does not exist"):
        sx.OneDeviceStrategy("gpu:0")
    with pytest.raises(ValueError, match="Cannot parse device"):
        resolve_device("banana")
    with pytest.raises(TypeError, match=r"jax\.Device"):
        resolve_device(3)


def test_duplicate_and_empty_device_lists_are_rejected():
    with pytest.raises(ValueError, match="twice"):
        resolve_devices(["cpu:0", "/cpu:0"])
    with pytest.raises(ValueError, match="empty"):
        sx.MirroredStrategy(devices=[])


def test_mirrored_uses_all_local_devices_by_default():
    assert sx.MirroredStrategy().num_replicas_in_sync == len(jax.local_devices())


def test_cross_device_ops_names_are_accepted():
    strategy = sx.MirroredStrategy(["cpu:0"], cross_device_ops=sx.NcclAllReduce())
    assert strategy.cross_device_ops.name == "nccl"
    assert isinstance(
        sx.MirroredStrategy(["cpu:0"],
                            cross_device_ops="HierarchicalCopyAllReduce").cross_device_ops,
        sx.HierarchicalCopyAllReduce,
    )
    with pytest.raises(ValueError, match="Unknown cross_device_ops"):
        sx.MirroredStrategy(["cpu:0"], cross_device_ops="carrier-pigeon")


def test_set_cpu_device_count_after_jax_started_is_an_error():
    jax.devices()
    with pytest.raises(RuntimeError, match="already started with 8 CPU"):
        sx.set_cpu_device_count(3)
    sx.set_cpu_device_count(8)  # same count: fine
    with pytest.raises(ValueError, match="positive integer"):
        sx.set_cpu_device_count(0)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    import os

    full_env = {k: v for k, v in os.environ.items() if k != "STRATAX_CPU_DEVICES"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=full_env)


@pytest.mark.timeout(150)
def test_set_cpu_device_count_before_jax_starts_and_env_variable():
    done = _run("""
        import stratax as sx
        sx.set_cpu_device_count(3)
        print(sx.MirroredStrategy().num_replicas_in_sync)
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "3"
    done = _run("import stratax as sx; print(sx.MirroredStrategy().num_replicas_in_sync)",
                STRATAX_CPU_DEVICES="5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "5"
    done = _run("import stratax", STRATAX_CPU_DEVICES="two")
    assert (done.returncode != 0
            and "STRATAX_CPU_DEVICES='two' is not an integer >= 1" in done.stderr)


def test_place_keeps_an_array_already_placed_and_places_the_rest():
    mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:2]), ("replica",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("replica"))
    placed = jax.device_put(np.arange(4.0), replicated)
    assert place(placed, replicated) is placed
    moved = place(placed, split)  # same values, another sharding: placed anew
    assert moved is not placed and moved.sharding == split
    np.testing.assert_array_equal(np.asarray(moved), np.arange(4.0))
    from_host = place(np.arange(4.0), replicated)
    assert from_host.sharding == replicated
    np.testing.assert_array_equal(np.asarray(from_host), np.arange(4.0))
