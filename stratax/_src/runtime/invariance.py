"""Which outputs of a replica function are identical on every replica.

``strategy.run`` returns TensorFlow's kinds of values: a *mirrored* value where every replica
computed the same thing (e.g. all-reduced gradients and the weights updated with them) and a
``PerReplica`` value otherwise (e.g. each replica's loss). JAX's own replication typing
(``check_vma``) cannot decide this for us: it turns the gradient of replicated weights into an
implicit all-reduce, which would silently double an explicit ``all_reduce`` of gradients written
the TensorFlow way. So replica functions run with ``check_vma=False`` (every value is per-replica,
as in TensorFlow) and this module reads the traced jaxpr instead, with a sound rule: a value
varies across replicas if it depends on a per-replica input or on the replica index, unless a
collective over the replica axis made it uniform again. Loops are followed to their fixed point
(a ``scan`` or ``while`` carry that varies after some iteration varies), so the weights a
scanned training loop updates with all-reduced gradients come back mirrored; a loop whose trip
count or a ``cond`` whose branch may differ per replica gives varying outputs. Anything the
rule cannot see through is treated as varying, which is always safe (``PerReplica`` instead of
mirrored).

Constants are the same on every replica: literals, and the values a replica function closes
over (an array, a Keras model's weights). The analysis is given the whole traced program
(``jit(shard_map(body))``), in which closed-over values are the program's constants; they reach
the ``shard_map`` body as extra operands (lifted by ``shard_map``), and the flags follow them in
like any other operand. Analysing the body alone would miss those operands.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

from jax.extend import core as jex_core

from stratax._src import seam

# Collectives whose result is the same on every participant of the axis.
_UNIFYING = frozenset({"psum", "pmax", "pmin", "all_gather"})
# Primitives whose result differs per participant even for identical inputs.
_DIVERSIFYING = frozenset(
    {"axis_index", "reduce_scatter", "psum_scatter", "all_to_all", "ppermute", "pbroadcast"}
)


@dataclasses.dataclass(frozen=True)
class _Replicas:
    """The replicas' mesh axis, and the custom calls that are all-reduces over it."""

    axis: str
    unifying_calls: frozenset[str]


def varying_outputs(jaxpr: Any, varying_inputs: Sequence[bool], axis: str,
                    unifying_calls: Collection[str] = ()) -> list[bool]:
    """For each output of ``jaxpr`` (``Jaxpr`` or ``ClosedJaxpr``): does it vary over ``axis``?

    Args:
        jaxpr: the traced program (constants included), e.g. ``jit(shard_map(body))``'s, or a
            per-replica body.
        varying_inputs: one flag per input variable (not per constant): True for per-replica
            inputs.
        axis: the mesh axis name of the replicas.
        unifying_calls: ``ffi_call`` targets whose result is the same on every replica (a
            transport's all-reduce: ``CrossDeviceOps.unifying_calls``).
    """
    return _varying(jaxpr, varying_inputs, _Replicas(axis, frozenset(unifying_calls)))


def _varying(jaxpr: Any, varying_inputs: Sequence[bool], replicas: _Replicas) -> list[bool]:
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    if len(varying_inputs) != len(inner.invars):
        raise ValueError(
            f"Got {len(varying_inputs)} input flags for a jaxpr with {len(inner.invars)} inputs."
        )
    varying: dict[Any, bool] = dict(zip(inner.invars, varying_inputs, strict=True))
    for var in inner.constvars:
        varying[var] = False

    def is_varying(atom: Any) -> bool:
        if isinstance(atom, jex_core.Literal):
            return False
        return varying.get(atom, True)

    for eqn in inner.eqns:
        flags = [is_varying(v) for v in eqn.invars]
        out = _equation_outputs(eqn, flags, replicas)
        for var, flag in zip(eqn.outvars, out, strict=True):
            varying[var] = flag
    return [is_varying(v) for v in inner.outvars]


def _axes_of(eqn: Any) -> tuple[Any, ...]:
    axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    return axes if isinstance(axes, tuple) else (axes,)


def _equation_outputs(eqn: Any, flags: list[bool], replicas: _Replicas) -> list[bool]:
    name = eqn.primitive.name
    n_out = len(eqn.outvars)
    if (name in _UNIFYING and replicas.axis in _axes_of(eqn)
            and eqn.params.get("axis_index_groups") is None):
        return [False] * n_out
    if name == "ffi_call" and eqn.params.get("target_name") in replicas.unifying_calls:
        return [False] * n_out
    if name in _DIVERSIFYING and replicas.axis in _axes_of(eqn):
        return [True] * n_out
    if name in _CONTROL_FLOW:
        return _CONTROL_FLOW[name](eqn, flags, replicas)
    sub = _same_arity_subjaxpr(eqn)
    if sub is not None:
        return _varying(sub, flags, replicas)
    any_varying = any(flags) or any(_contains_diversifying(j, replicas) for j in _subjaxprs(eqn))
    return [any_varying] * n_out


def _carried(body: Any, inputs: Callable[[list[bool]], list[bool]], carry: list[bool],
             replicas: _Replicas, steady: Callable[[list[bool]], bool] | None = None
             ) -> tuple[list[bool], list[bool]]:
    """A loop's carry flags at their fixed point, and the body's other output flags.

    ``inputs(carry)`` gives the body's input flags, and the body gives ``carry + rest``. A carry
    that varies after some iteration varies from then on, so the flags only grow: at most
    ``len(carry)`` rounds. ``steady(carry)`` says whether every replica runs the loop as often
    (if not, everything the loop gives varies).
    """
    while True:
        if steady is not None and not steady(carry):
            return [True] * len(carry), []
        out = _varying(body, inputs(carry), replicas)
        grown = [a or b for a, b in zip(carry, out[:len(carry)], strict=True)]
        if grown == carry:
            return carry, out[len(carry):]
        carry = grown


def _scan_outputs(eqn: Any, flags: list[bool], replicas: _Replicas) -> list[bool]:
    consts, carry = eqn.params["num_consts"], eqn.params["num_carry"]
    before, xs = flags[:consts], flags[consts + carry:]  # the body takes consts, carry, xs
    carry_flags, ys = _carried(eqn.params["jaxpr"], lambda c: before + c + xs,
                               flags[consts:consts + carry], replicas)
    return carry_flags + ys


def _while_outputs(eqn: Any, flags: list[bool], replicas: _Replicas) -> list[bool]:
    cond_consts, body_consts = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    cond_fixed = flags[:cond_consts]
    body_fixed = flags[cond_consts:cond_consts + body_consts]

    def steady(carry: list[bool]) -> bool:
        return not any(_varying(eqn.params["cond_jaxpr"], cond_fixed + carry, replicas))

    carry, _ = _carried(eqn.params["body_jaxpr"], lambda c: body_fixed + c,
                        flags[cond_consts + body_consts:], replicas, steady)
    return carry


def _cond_outputs(eqn: Any, flags: list[bool], replicas: _Replicas) -> list[bool]:
    if flags[0]:  # replicas may take different branches
        return [True] * len(eqn.outvars)
    branches = [_varying(branch, flags[1:], replicas) for branch in eqn.params["branches"]]
    return [any(column) for column in zip(*branches, strict=True)]


# Loops and branches: their outputs are followed through their bodies.
_CONTROL_FLOW = {"scan": _scan_outputs, "while": _while_outputs, "cond": _cond_outputs}


def _subjaxprs(eqn: Any) -> list[Any]:
    return list(seam.jaxprs_in_params(eqn.params.values()))


def _same_arity_subjaxpr(eqn: Any) -> Any:
    """The body of call-like primitives (``pjit``, ``custom_jvp_call``, ``remat``...), if any.

    Only a single sub-jaxpr that takes exactly the equation's inputs and gives exactly its
    outputs is a plain call we can look through; loops and conditionals are not.
    """
    if eqn.primitive.name in ("while", "cond", "scan"):
        return None
    subs = _subjaxprs(eqn)
    if len(subs) != 1:
        return None
    inner = getattr(subs[0], "jaxpr", subs[0])
    if len(inner.invars) == len(eqn.invars) and len(inner.outvars) == len(eqn.outvars):
        return subs[0]
    return None


def _contains_diversifying(jaxpr: Any, replicas: _Replicas) -> bool:
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in inner.eqns:
        if eqn.primitive.name in _DIVERSIFYING and replicas.axis in _axes_of(eqn):
            return True
        if any(_contains_diversifying(sub, replicas) for sub in _subjaxprs(eqn)):
            return True
    return False
