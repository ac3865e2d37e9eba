"""Fusing an all-reduce of many tensors into flat packs (``bytes_per_pack``)."""

import jax
import numpy as np
import pytest

import stratax as sx
from stratax._src.strategies.packing import plan_packs

F32, I32 = np.float32, np.int32


def test_plan_groups_same_dtype_in_order_up_to_the_pack_size():
    shapes = [((4,), F32), ((2, 2), F32), ((3,), I32), ((8,), F32), ((1,), I32)]
    # 16 + 16 bytes fit a 32-byte pack; the 32-byte tensor opens a new one; ints pack apart.
    assert plan_packs(shapes, 32) == [[0, 1], [2, 4], [3]]
    # A tensor larger than a pack travels alone; a pack size of 1 byte disables packing.
    assert plan_packs(shapes, 1) == [[0], [1], [2], [3], [4]]
    # 0 = automatic (32 MiB): everything of one dtype in one pack.
    assert plan_packs(shapes, 0) == [[0, 1, 3], [2, 4]]


def _grads_like(ctx_id):
    """A pytree shaped like an MLP's gradients plus an int counter, distinct per replica."""
    rng = np.random.default_rng(7)
    base = {"k1": rng.standard_normal((16, 8)).astype(F32),
            "b1": rng.standard_normal(8).astype(F32),
            "k2": rng.standard_normal((8, 3)).astype(F32), "n": np.arange(5, dtype=I32)}
    return jax.tree.map(lambda a: a * (ctx_id + 1), base)


@pytest.mark.parametrize("bytes_per_pack", [1, 64, 0])
@pytest.mark.parametrize("op", list(sx.ReduceOp))
def test_packed_all_reduce_equals_per_tensor_reduction(bytes_per_pack, op):
    strategy = sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(bytes_per_pack=bytes_per_pack))
    n = strategy.num_replicas_in_sync
    assert n > 1, "the test session forces several CPU devices (tests/conftest.py)"
    values = strategy.experimental_distribute_values_from_function(
        lambda ctx: _grads_like(ctx.replica_id_in_sync_group))
    out = strategy.run(lambda v: sx.get_replica_context().all_reduce(op, v), args=(values,))
    per_replica = [_grads_like(i) for i in range(n)]
    numpy_op = {"SUM": np.sum, "MEAN": np.mean, "MAX": np.max, "MIN": np.min}[op.name]
    for key in per_replica[0]:
        want = numpy_op(np.stack([p[key] for p in per_replica]), axis=0)
        if op is sx.ReduceOp.MEAN and want.dtype != np.asarray(out[key]).dtype:
            want = want.astype(np.asarray(out[key]).dtype)
        np.testing.assert_array_equal(np.asarray(out[key]), want, err_msg=key)
        assert np.asarray(out[key]).shape == per_replica[0][key].shape
