"""``strategy.extended`` on every data-parallel strategy, as TensorFlow's ``StrategyExtended``
answers (MultiWorkerMirrored on two real processes: ``tests/multiprocess``; parameter servers:
``tests/parameter_server/test_strategy_api.py``)."""

from __future__ import annotations

import jax
import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.core import env
from stratax._src.runtime import tpu_system


@pytest.fixture(autouse=True)
def _fresh_tpu_system(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(env.STRATAX_TPU_EMULATION, raising=False)
    yield
    tpu_system.system.resolver = tpu_system.system.topology = None


def _tpu(cores_per_replica: int = 1) -> sx.TPUStrategy:
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=4)
    topology = sx.tpu.experimental.initialize_tpu_system(resolver)
    assignment = sx.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, cores_per_replica],
        num_replicas=4 // cores_per_replica)
    return sx.TPUStrategy(resolver, experimental_device_assignment=assignment)


STRATEGIES = {
    "default": lambda: sx.get_strategy(),
    "one_device": lambda: sx.OneDeviceStrategy("cpu:1"),
    "mirrored_1": lambda: sx.MirroredStrategy(["cpu:0"]),
    "mirrored_4": lambda: sx.MirroredStrategy([f"cpu:{i}" for i in range(4)]),
    "mwms_local": lambda: sx.MultiWorkerMirroredStrategy(),
    "tpu": _tpu,
}


@pytest.fixture(params=sorted(STRATEGIES))
def strategy(request):
    return STRATEGIES[request.param]()


def _cpu(*indices: int) -> tuple[jax.Device, ...]:
    return tuple(jax.local_devices(backend="cpu")[i] for i in indices)


def test_one_process_checkpoints_writes_summaries_and_initializes(strategy):
    extended = strategy.extended
    assert extended is strategy.extended  # one view per strategy
    assert extended.should_checkpoint is True
    assert extended.should_save_summary is True
    assert extended.experimental_should_init is True and extended.should_init is True
    assert extended.experimental_require_static_shapes is isinstance(strategy, sx.TPUStrategy)


def test_worker_and_parameter_devices_are_the_replicas_devices():
    assert sx.OneDeviceStrategy("cpu:1").extended.worker_devices == _cpu(1)
    mirrored = sx.MirroredStrategy(["cpu:2", "cpu:0", "cpu:3"])
    assert mirrored.extended.worker_devices == _cpu(2, 0, 3)  # replica order
    assert mirrored.extended.parameter_devices == _cpu(2, 0, 3)  # mirrored variables
    assert mirrored.extended.non_slot_devices([]) == _cpu(2, 0, 3)
    assert sx.get_strategy().extended.worker_devices == (jax.local_devices()[0],)
    # A TPU replica over 2 logical cores: one device per replica, its first core.
    model_parallel = _tpu(cores_per_replica=2)
    cores = model_parallel.mesh.devices
    assert cores.shape == (2, 2)
    assert model_parallel.extended.worker_devices == (cores[0, 0], cores[1, 0])
    assert len(_tpu().extended.worker_devices) == 4


def test_variable_created_in_scope_knows_which_strategy_made_it():
    first = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    second = sx.MirroredStrategy(["cpu:0", "cpu:1"])  # the same devices: only scope tells
    with first.scope():
        mine = keras.Variable(np.zeros(3, np.float32), name="mine")
    with second.scope():
        theirs = keras.Variable(np.zeros(3, np.float32), name="theirs")
    plain = keras.Variable(np.zeros(3, np.float32), name="plain")
    assert first.extended.variable_created_in_scope(mine)
    assert not first.extended.variable_created_in_scope(theirs)
    assert not first.extended.variable_created_in_scope(plain)
    assert second.extended.variable_created_in_scope(theirs)
    default = sx.get_strategy().extended
    assert default.variable_created_in_scope(plain) and not default.variable_created_in_scope(mine)

    # Mirrored: every variable is on every replica already; the block only checks its argument.
    with first.scope(), first.extended.colocate_vars_with(mine):
        slot = keras.Variable(np.ones(3, np.float32), name="slot")
    assert first.extended.variable_created_in_scope(slot)
    with (pytest.raises(ValueError, match="colocate_vars_with needs a variable created in this"),
          first.extended.colocate_vars_with(theirs)):
        pass


def test_reduce_to_and_batch_reduce_to_combine_replicas_onto_destinations():
    strategy = sx.MirroredStrategy([f"cpu:{i}" for i in range(4)])
    ids = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((2,), ctx.replica_id_in_sync_group + 1, np.float32))
    with strategy.scope():
        var = keras.Variable(np.zeros(2, np.float32))
    total = strategy.extended.reduce_to(sx.ReduceOp.SUM, ids, var)
    np.testing.assert_array_equal(total, [10.0, 10.0])
    assert total.sharding == var.value.sharding  # placed as the variable is

    with strategy.scope():
        matrix = keras.Variable(np.zeros((4, 2), np.float32))
    count = strategy.extended.reduce_to("SUM", np.float32(1.0), matrix)  # its devices only
    assert float(count) == 4.0 and count.sharding.mesh == matrix.value.sharding.mesh

    on_one = strategy.extended.reduce_to("MEAN", ids, "cpu:3")
    np.testing.assert_array_equal(on_one, [2.5, 2.5])
    assert on_one.devices() == set(_cpu(3))

    mean, largest, everywhere = strategy.extended.batch_reduce_to(
        sx.ReduceOp.MAX, [(ids, var), (ids, "cpu:0"), (ids, strategy.extended.worker_devices)])
    for value in (mean, largest, everywhere):
        np.testing.assert_array_equal(value, [4.0, 4.0])
    assert everywhere.sharding.is_fully_replicated and len(everywhere.devices()) == 4

    with pytest.raises(TypeError, match="reduce_to destinations must be a variable"):
        strategy.extended.reduce_to("SUM", ids, object())
    with pytest.raises(ValueError, match="does not exist in this process"):
        strategy.extended.reduce_to("SUM", ids, "cpu:99")


def test_update_runs_fn_once_on_the_variable_and_value_container_is_the_value():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        var = keras.Variable(np.zeros(2, np.float32))
    calls = []

    def add(v, delta, scale=1.0):
        calls.append(delta)
        v.assign(v.value + delta * scale)
        return v

    delta = sx.Mirrored(np.ones(2, np.float32))  # passed as its value
    assert strategy.extended.update(var, add, args=(delta,), kwargs={"scale": 3.0}) is var
    assert len(calls) == 1
    np.testing.assert_array_equal(var.numpy(), [3.0, 3.0])
    assert strategy.extended.value_container(var) is var

    per_replica = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.float32(ctx.replica_id_in_sync_group))
    with pytest.raises(TypeError, match=r"got a PerReplica argument; .* reduce it first"):
        strategy.extended.update(var, add, args=(per_replica,))
