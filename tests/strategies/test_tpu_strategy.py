"""TPUStrategy on 8 emulated cores: the explicit switch, topology, device assignment, cores."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stratax as sx
from stratax._src.core import env
from stratax._src.runtime import tpu_system


@pytest.fixture(autouse=True)
def _fresh_tpu_system(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(env.STRATAX_TPU_EMULATION, raising=False)
    for name in (env.TPU_NAME, env.TPU_WORKER_ID, env.TPU_WORKER_HOSTNAMES,
                 env.TPU_ACCELERATOR_TYPE, env.COLAB_TPU_ADDR):
        monkeypatch.delenv(name, raising=False)
    yield
    tpu_system.system.resolver = tpu_system.system.topology = None


def _emulated(cores: int = 8) -> sx.cluster_resolver.TPUClusterResolver:
    return sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=cores)


def test_without_a_tpu_and_without_emulation_it_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"No TPU found: JAX sees only cpu devices.*"
                                           r"STRATAX_TPU_EMULATION=8"):
        sx.TPUStrategy(sx.cluster_resolver.TPUClusterResolver(tpu=""))


def test_emulation_needs_enough_cpu_devices() -> None:
    with pytest.raises(RuntimeError, match="emulation with 64 cores needs 64 CPU devices"):
        sx.tpu.experimental.initialize_tpu_system(_emulated(64))


def test_guide_start_up_emulated(monkeypatch: pytest.MonkeyPatch,
                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(env.STRATAX_TPU_EMULATION, "8")
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="")
    sx.config.experimental_connect_to_cluster(resolver)
    with caplog.at_level(logging.INFO):
        topology = sx.tpu.experimental.initialize_tpu_system(resolver)
        strategy = sx.TPUStrategy(resolver)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("stratax")]
    assert "emulated" in ours[0]
    assert topology.mesh_shape.tolist() == [4, 1, 1, 2]
    assert (topology.num_tasks, topology.num_tpus_per_task, topology.emulated) == (1, 8, True)
    assert topology.missing_devices.shape == (0, 4)
    assert strategy.num_replicas_in_sync == 8 and strategy.num_cores_per_replica == 1
    assert dict(strategy.mesh.shape) == {"replica": 8, "core": 1}
    assert "emulated on 8 CPU devices" in repr(strategy)


def test_device_assignment_replicas_by_logical_cores() -> None:
    resolver = _emulated()
    topology = sx.tpu.experimental.initialize_tpu_system(resolver)
    assignment = sx.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, 2], num_replicas=4)
    assert (assignment.num_replicas, assignment.num_cores_per_replica) == (4, 2)
    assert assignment.coordinates(1, 1) == (1, 0, 0, 1)
    assert assignment.tpu_ordinal(1, 1) == 3
    assert assignment.tpu_device(2, 0) == "/job:worker/task:0/device:TPU:4"
    assert assignment.lookup_replicas(0, 0) == [0, 1, 2, 3]
    strided = sx.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=[2, 1, 1, 1], computation_stride=[2, 1, 1, 1], num_replicas=4)
    assert strided.core_assignment[:, :, 0].tolist() == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert strided.core_assignment[:, :, 3].tolist() == [[0, 0], [0, 0], [1, 1], [1, 1]]
    strategy = sx.TPUStrategy(resolver, experimental_device_assignment=assignment)
    assert dict(strategy.mesh.shape) == {"replica": 4, "core": 2}
    assert strategy.num_replicas_in_sync == 4


def test_device_assignment_errors() -> None:
    topology = sx.tpu.experimental.initialize_tpu_system(_emulated())
    build = sx.tpu.experimental.DeviceAssignment.build
    with pytest.raises(ValueError, match=r"computation_shape \[3, 1, 1, 1\].*does not tile"):
        build(topology, computation_shape=[3, 1, 1, 1])
    with pytest.raises(ValueError, match=r"num_replicas=5 does not fit.*1 to 4 replicas"):
        build(topology, computation_shape=[1, 1, 1, 2], num_replicas=5)
    with pytest.raises(ValueError, match="must be 4 positive integers"):
        build(topology, computation_shape=[2])


def _model_parallel_strategy() -> sx.TPUStrategy:
    resolver = _emulated()
    topology = sx.tpu.experimental.initialize_tpu_system(resolver)
    assignment = sx.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, 2], num_replicas=4)
    return sx.TPUStrategy(resolver, experimental_device_assignment=assignment)


def test_split_to_logical_devices_keeps_values_and_shards_over_cores() -> None:
    strategy = _model_parallel_strategy()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 6, 8)).astype(np.float32)
    w = rng.normal(size=(8, 16)).astype(np.float32)
    layouts = []

    def step(x, w, split):
        h = jnp.tanh(x @ w)
        if split:
            h = strategy.experimental_split_to_logical_devices(h, [1, 2])
            jax.debug.inspect_array_sharding(h, callback=layouts.append)
        h = strategy.experimental_replicate_to_logical_devices(h)
        h = strategy.experimental_assign_to_logical_device(h, 1)
        return sx.get_replica_context().all_reduce("sum", h.sum(axis=1)), h

    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: x[ctx.replica_id_in_sync_group])
    total_split, h_split = strategy.run(step, (per_replica, w, True))
    total_plain, _ = strategy.run(step, (per_replica, w, False))
    np.testing.assert_allclose(np.asarray(total_split), np.asarray(total_plain), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(h_split.stacked), np.tanh(x @ w), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(total_plain), np.tanh(x @ w).sum(axis=(0, 2)), rtol=1e-5)
    assert layouts and all(s.spec == jax.sharding.PartitionSpec(None, "core") for s in layouts), \
        layouts
    assert len(strategy.experimental_local_results(h_split)) == 4


def test_logical_device_errors() -> None:
    strategy = _model_parallel_strategy()
    x = jnp.ones((4, 6))
    with pytest.raises(ValueError, match=r"multiply to 4, but each replica has 2 logical cores"):
        strategy.experimental_split_to_logical_devices(x, [2, 2])
    with pytest.raises(ValueError, match="has 1 entries but the tensor has rank 2"):
        strategy.experimental_split_to_logical_devices(x, [2])
    with pytest.raises(ValueError, match=r"size 3\) does not split evenly over 2"):
        strategy.experimental_split_to_logical_devices(jnp.ones((3, 4)), [2, 1])
    with pytest.raises(ValueError, match="logical_device_id=2 is not a logical core"):
        strategy.experimental_assign_to_logical_device(x, 2)
    split = strategy.experimental_split_to_logical_devices(x, [1, 2])   # outside run: placed
    assert split.sharding.spec == jax.sharding.PartitionSpec(None, "core")


def test_connect_to_a_pod_after_jax_started_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(env.TPU_WORKER_HOSTNAMES, "10.0.0.2,10.0.0.3")
    monkeypatch.setenv(env.TPU_WORKER_ID, "1")
    jax.devices()   # JAX has started in this test process
    with pytest.raises(RuntimeError, match="can no longer join the other hosts of the TPU pod"):
        sx.config.experimental_connect_to_cluster(sx.cluster_resolver.TPUClusterResolver())


def test_connect_needs_a_tpu_resolver() -> None:
    with pytest.raises(TypeError, match=r"Expected a TPUClusterResolver.*MultiWorkerMirrored"):
        sx.config.experimental_connect_to_cluster(sx.cluster_resolver.SimpleClusterResolver({}))


@pytest.mark.parametrize("from_function", [False, True])
def test_custom_loop_batches_keep_one_shape_for_the_whole_epoch(from_function: bool) -> None:
    """A short last batch is padded to the full one: one program serves the epoch, and the
    padding rows stay out of reductions and gathers (Mirrored keeps the short shape)."""
    resolver = _emulated()
    sx.tpu.experimental.initialize_tpu_system(resolver)
    strategy = sx.TPUStrategy(resolver)
    x = np.arange(160 * 4, dtype=np.float32).reshape(160, 4)
    batches = [x[:64], x[64:128], x[128:]]  # per replica: 8, 8, then 4 rows
    if from_function:
        per_replica = [b[i * len(b) // 8:(i + 1) * len(b) // 8] for b in batches for i in range(8)]
        dataset = strategy.distribute_datasets_from_function(lambda _: per_replica)
    else:
        dataset = strategy.experimental_distribute_dataset(batches)
    shapes = []

    def step(batch):
        shapes.append(batch.shape)  # once per trace
        return batch * 2.0

    totals, rows = [], []
    for batch in dataset:
        doubled = strategy.run(step, args=(batch,))
        totals.append(float(strategy.reduce("SUM", doubled, axis=0).sum()))
        rows.append(strategy.gather(doubled, axis=0).shape[0])
    assert shapes == [(8, 4)]
    assert rows == [64, 64, 32]
    np.testing.assert_allclose(totals, [2 * b.sum() for b in batches])
    mirrored = sx.MirroredStrategy([f"cpu:{i}" for i in range(8)])
    last = list(mirrored.experimental_distribute_dataset(batches))[-1]
    assert last.stacked.shape == (8, 4, 4)


def test_the_default_assignment_on_a_pod_lists_the_replicas_host_by_host():
    """Chips whose coordinate order interleaves two hosts (as a pod slice's may): the default
    assignment puts host 0's replicas first, each host's in coordinate order."""
    from types import SimpleNamespace

    from stratax._src.runtime.tpu_topology import DeviceAssignment
    from stratax._src.strategies.tpu import _host_by_host

    class Core:  # hashable, as JAX's devices are
        def __init__(self, name: str, process_index: int) -> None:
            self.name, self.process_index = name, process_index

    coordinates = [(x, 0, 0, 0) for x in range(4)]
    devices = {c: Core(f"core {c[0]}", c[0] % 2) for c in coordinates}
    topology = SimpleNamespace(device_at_coordinates=lambda c: devices[tuple(int(v) for v in c)])
    interleaved = DeviceAssignment(topology, np.array([[c] for c in coordinates]))
    ordered = _host_by_host(interleaved)
    assert [d.name for d in ordered.devices()[:, 0]] == ["core 0", "core 2", "core 1", "core 3"]
    assert _host_by_host(ordered) is ordered
