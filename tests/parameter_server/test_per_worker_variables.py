"""Per-worker variables (TensorFlow's ``per_worker_variable=True``): the recorded program, a
worker's copies, and the strategy's API on an in-process cluster (the real-process case, with
a worker killed and restarted, is ``test_per_worker_variables_on_workers.py``)."""

import re

import jax
import numpy as np
import pytest
from cluster_helpers import local_cluster  # noqa: F401 - a fixture

import stratax as sx
from stratax._src.parameter_server import program
from stratax._src.parameter_server.per_worker_variables import (
    MISSING,
    PerWorkerVariable,
    WorkerCopies,
)
from stratax._src.parameter_server.variables import Placement, PSVariable

pytestmark = pytest.mark.timeout(180)


def _per_worker(name, value):
    return PerWorkerVariable(name, f"ns/{name}", np.asarray(value), read_all=lambda var: [])


def _build(fn):
    """``fn()`` recorded as ``strategy.run`` records a replica function without arguments."""
    no_args = ((), {})
    return program.build_program("p0", lambda packed: fn(), [],
                                 jax.tree_util.tree_structure((no_args,)))


def test_program_takes_per_worker_values_as_inputs_and_returns_their_new_values():
    counter = _per_worker("counter", np.float32(0))
    other = _per_worker("other", np.zeros((2, 3), np.float32))
    w = PSVariable("w", (3,), np.float32, True, [Placement(0, "w", 0, 3)],
                   pull=None, assign=None)

    def fn():
        value = program.read(counter)
        program.assign([counter, other], [value + 1, program.read(other) * 2])
        return program.read(w).sum() + value

    built = _build(fn)
    assert built.meta["locals"] == ["ns/counter", "ns/other"]
    assert built.meta["local_assigns"] == ["ns/counter", "ns/other"]
    assert built.meta["dense"] == ["w"] and built.meta["assigns"] == []
    assert built.per_worker == [counter, other]
    assert [v["name"] for v in built.meta["variables"]] == ["w"]  # nothing for the ps
    step = jax.export.deserialize(bytearray(built.step))
    grads, outputs = step.call([np.ones(3, np.float32)], [], [], [],
                               [np.float32(4), np.ones((2, 3), np.float32)])
    assert float(grads[0]) == 5.0 and np.asarray(grads[1]).tolist() == [[2.0] * 3] * 2
    assert float(outputs[0]) == 7.0


def test_per_worker_variables_refuse_training_and_are_assigned_once():
    table = _per_worker("vocab", np.zeros((4, 2), np.float32))
    for body, what in [(lambda: program.apply_gradients([(np.zeros((4, 2)), table)],
                                                        {"class_name": "SGD", "config": {}}),
                        "strategy.apply_gradients"),
                       (lambda: program.read_rows(table, np.array([0, 1])),
                        "strategy.read_rows")]:
        expected = re.escape(f"{what} got the per-worker variable 'vocab'")
        with pytest.raises(TypeError, match=expected):
            _build(body)

    def twice():
        program.assign(table, np.zeros((4, 2)))
        program.assign(table, np.ones((4, 2)))

    with pytest.raises(ValueError, match="'vocab' is assigned twice in one step"):
        _build(twice)
    with pytest.raises(ValueError, match=r"'vocab' has shape \(4, 2\), the value \(3,\)"):
        _build(lambda: program.assign(table, np.zeros(3)))


def test_a_per_worker_variable_keeps_the_dtype_jax_computes_in():
    counter = _per_worker("counter", np.int64(3))
    assert counter.dtype == jax.dtypes.canonicalize_dtype(np.int64) == counter.initial_value.dtype
    assert not counter.initial_value.flags.writeable and counter.trainable is False
    assert repr(counter) == ("<PerWorkerVariable 'counter' shape=() dtype="
                             f"{counter.dtype} one copy per worker>")


def test_worker_copies_keep_their_value_when_created_again():
    copies = WorkerCopies(task_index=1)
    copies.create(["a"], [np.zeros(2)])
    copies.write(["a"], [np.array([3.0, 4.0])])
    copies.create(["a", "b"], [np.zeros(2), np.ones(1)])   # a second creation of "a"
    assert [v.tolist() for v in copies.read(["a", "b"])] == [[3.0, 4.0], [1.0]]
    copies.clear()
    with pytest.raises(KeyError, match=f"{MISSING} \\['a'\\] on worker 1"):
        copies.read(["a"])


def test_scheduled_steps_update_the_running_workers_copy_only(local_cluster):  # noqa: F811
    strategy = local_cluster()
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    shards = strategy._ps.clients[0].call("ping").meta["shards"] + strategy._ps.clients[1].call(
        "ping").meta["shards"]
    with strategy.scope():
        steps = strategy.create_variable(0.0, name="steps", per_worker=True)
        vocab = strategy.create_variable(np.full((2, 3), 7, np.int32), per_worker=True)
    assert isinstance(steps, sx.PerWorkerVariable) and not steps.trainable
    assert steps.shape == () and steps.dtype == np.float32 and vocab.name == "Variable"
    assert strategy.variables == []                          # nothing on the parameter servers
    assert steps.read_all() == [0.0]                         # the initial value before any step
    assert vocab.read_all()[0].tolist() == [[7] * 3] * 2

    def replica_fn():
        count = strategy.read(steps)
        strategy.assign(steps, count + 1)
        strategy.assign(vocab, strategy.read(vocab) - 1)
        return count

    results = [coordinator.schedule(lambda: [strategy.run(replica_fn) for _ in range(3)])
               for _ in range(4)]
    coordinator.join()
    assert [[float(c) for c in r.fetch()] for r in results] == [
        [3.0 * i, 3.0 * i + 1, 3.0 * i + 2] for i in range(4)]
    assert steps.read_all() == [12.0]
    assert vocab.read_all()[0].tolist() == [[-5] * 3] * 2
    after = strategy._ps.clients[0].call("ping").meta["shards"] + strategy._ps.clients[1].call(
        "ping").meta["shards"]
    assert after == shards                                   # the ps hold nothing for them

    with pytest.raises(TypeError, match=r"strategy\.apply_gradients got the per-worker variable"):
        coordinator.schedule(lambda: strategy.run(
            lambda: strategy.apply_gradients([(np.float32(1), steps)], {"class_name": "SGD",
                                                                        "config": {}})))
    with pytest.raises(ValueError, match="per_worker=True\\) got a partition-aware initializer"):
        strategy.create_variable(lambda shard_info: np.zeros(2), name="t", shape=(2,),
                                 per_worker=True)
    with pytest.raises(ValueError, match=r"shape=\(3,\) but the initial value has shape \(\)"):
        strategy.create_variable(0.0, shape=(3,), per_worker=True)


@pytest.mark.parametrize("spelling", ["create_variable", "keras.Variable"])
def test_tensorflows_per_worker_variable_spelling(local_cluster, spelling):  # noqa: F811
    # TensorFlow's cluster_coordinator_test.testPerWorkerVariableCreation: a variable made
    # under the scope with per_worker_variable=True, incremented by scheduled closures.
    import keras

    strategy = local_cluster()
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        if spelling == "keras.Variable":
            var = keras.Variable([0.0], dtype="float32", name="var", per_worker_variable=True)
        else:
            var = strategy.create_variable([0.0], shape=[1], dtype="float32", name="var",
                                           per_worker_variable=True)

    def worker_fn():
        strategy.run(lambda: strategy.assign(var, strategy.read(var) + 1.0))

    copies = strategy.place_variables(var)
    assert isinstance(copies, sx.PerWorkerVariable) and copies.shape == (1,)
    for ix in range(3):
        coordinator.schedule(worker_fn)
        coordinator.join()
        assert float(sum(copies.read_all())[0]) == ix + 1   # read many times: up to date
    for _ in range(3):
        coordinator.schedule(worker_fn)
    coordinator.join()
    assert float(sum(copies.read_all())[0]) == 6.0 and strategy.variables == []
    assert strategy.place_variables(var) is copies


def test_keras_per_worker_variable_only_under_the_scope_and_before_placement(local_cluster):  # noqa: F811
    import keras

    strategy = local_cluster()
    outside = keras.Variable([0.0], name="outside", per_worker_variable=True)  # Keras drops it
    assert isinstance(strategy.place_variables(outside), sx.PSVariable)
    with pytest.raises(ValueError, match="'outside' is already on the parameter servers"):
        strategy.mark_per_worker(outside)
    with strategy.scope():
        plain = keras.Variable([0.0], name="plain", per_worker_variable=False)
    assert isinstance(strategy.place_variables(plain), sx.PSVariable)
