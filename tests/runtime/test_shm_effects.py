"""The shared-memory all-reduce leaves JAX's effect system when it is a program's only one.

``shm_calls.unordered_if_alone`` rewrites a traced program: with exactly one call site
of the all-reduce (in a loop body too), the call is no longer side-effecting and the program
carries no FFI effect, so JAX dispatches it from its C++ fast path; with any doubt (two sites,
an unrolled loop, another side-effecting FFI call) the program is returned untouched. Tracing
needs no compiled library: the calls are never run here.
"""

import jax
import jax.numpy as jnp
from jax.extend import core as jax_core

from stratax._src.runtime import shm_calls, shm_collectives

SHAPE = jax.ShapeDtypeStruct((4,), jnp.float32)


def _shm(x, *, target=shm_collectives.TARGET):
    return jax.ffi.ffi_call(target, SHAPE, has_side_effect=True)(x)


def _jaxpr(fn):
    return jax.make_jaxpr(fn)(jnp.ones(4, jnp.float32)).jaxpr


def _equations(jaxpr):
    """Every equation of ``jaxpr``, those of loop bodies and branches included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            values = value if type(value) in (tuple, list) else (value,)
            for item in values:
                inner = getattr(item, "jaxpr", item)
                if isinstance(inner, jax_core.Jaxpr):
                    yield from _equations(inner)


def _stripped(jaxpr):
    """No effect left anywhere, and the call itself no longer side-effecting."""
    equations = list(_equations(jaxpr))
    calls = [e for e in equations if e.primitive.name == "ffi_call"]
    return (not jaxpr.effects and calls and not any(e.effects for e in equations)
            and not any(e.params["has_side_effect"] for e in calls))


def _runs_effect_free(jaxpr):
    """Evaluating the rewritten program traces again without any effect (the replay's path)."""
    fn = jax_core.jaxpr_as_fun(jax_core.ClosedJaxpr(jaxpr, ()))
    return not jax.make_jaxpr(fn)(jnp.ones(4, jnp.float32)).effects


def test_one_call_is_no_longer_an_effect():
    traced = _jaxpr(lambda x: _shm(x * 2.0) + 1.0)
    assert traced.effects  # JAX's FFI effect, before
    rewritten = shm_calls.unordered_if_alone(traced)
    assert _stripped(rewritten)
    assert _runs_effect_free(rewritten)
    assert traced.effects  # the traced program itself is left as it was


def test_one_call_in_a_loop_body_and_in_one_branch_is_one_call():
    def scanned(x):
        return jax.lax.scan(lambda c, _: (_shm(c) * 0.5, None), x, None, length=3)[0]

    def branched(x):
        return jax.lax.cond(x[0] > 0, _shm, lambda v: v * 3.0, x)

    for fn in (scanned, branched):
        rewritten = shm_calls.unordered_if_alone(_jaxpr(fn))
        assert _stripped(rewritten), fn.__name__
        assert _runs_effect_free(rewritten), fn.__name__


def test_several_calls_an_unrolled_loop_or_another_ffi_effect_keep_the_effect():
    def two(x):
        return _shm(_shm(x) + 1.0)

    def unrolled(x):
        return jax.lax.scan(lambda c, _: (_shm(c), None), x, None, length=4, unroll=2)[0]

    def with_another_effect(x):
        return _shm(_shm(x, target="someone_elses_side_effect"))

    for fn in (two, unrolled, with_another_effect):
        traced = _jaxpr(fn)
        assert shm_calls.unordered_if_alone(traced) is traced, fn.__name__


def test_programs_without_the_call_are_returned_as_they_are():
    traced = _jaxpr(lambda x: jnp.sin(x) @ x)
    assert shm_calls.unordered_if_alone(traced) is traced
