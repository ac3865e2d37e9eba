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
