"""The transport switch and the collectives object every step asks.

``CommunicationOptions(implementation=...)`` names the CPU collectives and wins over
``sx.config`` and ``STRATAX_CPU_COLLECTIVES``; ``strategy.cross_device_ops`` is chosen once, when
the strategy is built, and ``strategy.run``'s all-reduce and ``fit``'s packed step both ask it.
"""

import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.core.config import config
from stratax._src.runtime import cpu_collectives
from stratax._src.strategies import transport
from stratax._src.strategies.multi_worker import CommunicationImplementation


@pytest.mark.parametrize(("given", "member", "collectives"), [
    (None, None, None),
    ("auto", CommunicationImplementation.AUTO, "auto"),
    (" Gloo ", CommunicationImplementation.GLOO, "gloo"),
    ("shm", CommunicationImplementation.SHM, "shm"),
    ("MPI", CommunicationImplementation.MPI, "mpi"),
    ("ring", CommunicationImplementation.RING, "gloo"),  # TensorFlow's ring: gloo's
    (CommunicationImplementation.NCCL, CommunicationImplementation.NCCL, None),  # GPUs
])
def test_implementation_names_the_cpu_collectives(given, member, collectives):
    options = sx.CommunicationOptions(implementation=given)
    assert options.implementation is member
    assert options.cpu_collectives == collectives


def test_an_unknown_implementation_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"Unknown implementation 'tcp'; use one of \['AUTO', "
                                         r"'RING', 'NCCL', 'GLOO', 'SHM', 'MPI'\]"):
        sx.CommunicationOptions(implementation="tcp")


def test_the_argument_wins_over_sx_config_which_wins_over_the_variable(monkeypatch):
    monkeypatch.setenv("STRATAX_CPU_COLLECTIVES", "shm")
    assert cpu_collectives.resolve(sx.CommunicationOptions().cpu_collectives) == "shm"
    try:
        config.update("cpu_collectives", "gloo")
        assert cpu_collectives.resolve(sx.CommunicationOptions().cpu_collectives) == "gloo"
        explicit = sx.CommunicationOptions(implementation="auto").cpu_collectives
        assert cpu_collectives.resolve(explicit) == "auto"
    finally:
        config.reset()


def test_mpi_from_the_argument_still_needs_mpitrampoline(monkeypatch):
    monkeypatch.delenv("MPITRAMPOLINE_LIB", raising=False)
    with pytest.raises(ValueError, match="MPITRAMPOLINE_LIB"):
        cpu_collectives.resolve(sx.CommunicationOptions(implementation="mpi").cpu_collectives)


@pytest.mark.parametrize("make", [
    lambda: sx.OneDeviceStrategy("cpu:0"),
    lambda: sx.MirroredStrategy(["cpu:0", "cpu:1"]),
    lambda: sx.MultiWorkerMirroredStrategy(),  # local mode: one process
], ids=["one_device", "mirrored", "multi_worker_local"])
def test_strategies_in_one_process_run_xla_collectives(make):
    ops = make().cross_device_ops
    assert type(ops) is sx.CrossDeviceOps and ops.name == "xla"
    assert ops.unifying_calls == frozenset()
    assert ops.exchanges() == "the all-reduce is not over shared memory on one host"


def test_choose_takes_what_the_user_passed():
    mesh = sx.MirroredStrategy(["cpu:0", "cpu:1"]).mesh
    wanted = sx.ReductionToOneDevice()
    assert transport.choose(mesh, wanted) is wanted
    assert type(transport.choose(mesh)) is sx.CrossDeviceOps


class _Recording(sx.CrossDeviceOps):
    """XLA's collectives, counting the all-reduces traced through them."""

    name = "recording"

    def __init__(self):
        super().__init__()
        self.calls = []

    def all_reduce(self, op, value, bytes_per_pack, *, only_call=False):
        self.calls.append((op, only_call))
        return super().all_reduce(op, value, bytes_per_pack, only_call=only_call)


def test_the_passed_cross_device_ops_is_what_strategy_run_asks():
    ops = _Recording()
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=ops)
    assert strategy.cross_device_ops is ops

    def step(x):
        return sx.get_replica_context().all_reduce("sum", x)

    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((3,), ctx.replica_id_in_sync_group + 1.0, np.float32))
    result = strategy.run(step, args=(values,))
    np.testing.assert_array_equal(np.asarray(strategy.experimental_local_results(result)[0]),
                                  np.full((3,), 3.0, np.float32))
    assert ops.calls == [(sx.ReduceOp.SUM, False)]


def test_the_passed_cross_device_ops_is_what_fits_packed_step_asks():
    ops = _Recording()
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=ops)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    x = np.ones((8, 4), np.float32)
    y = np.zeros((8, 2), np.float32)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert ops.calls == [(sx.ReduceOp.SUM, True)]  # traced once: the packed step's gradients
