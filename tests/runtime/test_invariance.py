"""The invariance rule: which outputs of a traced replica program are the same on every replica."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from stratax._src.runtime.invariance import varying_outputs


def _program(body, n_inputs, specs):
    mesh = Mesh(np.array(jax.devices()[:2]), ("replica",))
    mapped = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("replica"),
                           check_vma=False)
    return jax.jit(mapped).trace(*[jax.ShapeDtypeStruct((2, 3), jnp.float32)] * n_inputs).jaxpr


def test_closed_over_constants_are_invariant_and_per_replica_inputs_vary():
    w = jnp.arange(3.0)
    host = np.ones(3, np.float32)

    def body(x, y):
        return [(w * 2 + host)[None], (x[0] * w)[None], jax.lax.psum(x[0] * host, "replica")[None],
                (y[0] + w)[None], (y[0] + jax.lax.axis_index("replica"))[None]]

    program = _program(body, 2, (P("replica"), P()))
    assert len(program.consts) >= 1  # the closure really is a constant of the program
    assert varying_outputs(program, [True, False], "replica") == [False, True, False, False, True]


def test_flags_must_match_the_program_inputs():
    program = _program(lambda x: [x], 1, (P("replica"),))
    with pytest.raises(ValueError, match="Got 2 input flags for a jaxpr with 1 inputs"):
        varying_outputs(program, [True, False], "replica")


def test_loops_are_followed_to_their_fixed_point():
    """A training loop in ``scan``: weights updated with all-reduced gradients stay the same on
    every replica; anything fed by the replica's own rows varies, even if only after a few
    iterations (``late`` takes ``early``'s value, which took the rows' one step before)."""

    def body(x, w):
        def step(carry, row):
            w, total, early, _ = carry
            grad = jax.lax.psum(row * w, "replica")
            return (w - 0.1 * grad, total + row, row, early), row * 2

        (w, total, early, late), rows = jax.lax.scan(
            step, (w[0], jnp.zeros(3), jnp.zeros(3), jnp.zeros(3)), x[0])
        return [o[None] for o in (w, total, early, late, rows)]

    mesh = Mesh(np.array(jax.devices()[:2]), ("replica",))
    mapped = jax.shard_map(body, mesh=mesh, in_specs=(P("replica"), P()),
                           out_specs=P("replica"), check_vma=False)
    program = jax.jit(mapped).trace(jax.ShapeDtypeStruct((2, 4, 3), jnp.float32),
                                    jax.ShapeDtypeStruct((1, 3), jnp.float32)).jaxpr
    assert varying_outputs(program, [True, False], "replica") == [False, True, True, True, True]


def test_while_loops_and_branches():
    def body(x, y):
        n = jnp.sum(y[0])  # the same on every replica
        # An invariant number of iterations: the psum'ed carry stays invariant.
        same = jax.lax.fori_loop(0, n.astype(jnp.int32),
                                 lambda i, c: c + jax.lax.psum(x[0], "replica"), y[0])
        # A per-replica number of iterations: whatever the loop carries varies.
        counted = jax.lax.while_loop(lambda c: c[0] < jnp.sum(x[0]), lambda c: c + 1.0, y[0])
        # A branch chosen the same way everywhere, both branches invariant; then one chosen
        # per replica.
        chosen = jax.lax.cond(n > 0, lambda v: v * 2, lambda v: v + 1, y[0])
        split = jax.lax.cond(jnp.sum(x[0]) > 0, lambda v: v * 2, lambda v: v + 1, y[0])
        mixed = jax.lax.cond(n > 0, lambda v: v + x[0], lambda v: v, y[0])
        return [o[None] for o in (same, counted, chosen, split, mixed)]

    program = _program(body, 2, (P("replica"), P()))
    assert varying_outputs(program, [True, False], "replica") == [False, True, False, True, True]
