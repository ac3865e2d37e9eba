"""Compiles and calls a replica function for ``strategy.run``: one trace per argument structure.

``RunCompiler.run(fn, args, kwargs)`` sorts the arguments into three kinds — ``PerReplica``
(each replica gets its own component), arrays and ``Mirrored`` (every replica gets the whole
value) and other Python values (constants of the step) — and looks up a compiled step keyed by
``(fn, tree structure, kinds, constants, shapes and dtypes)`` in a small LRU cache.

On a miss the Python function is traced exactly once, inside ``jax.shard_map`` over the mesh
(``jax.jit(...).trace``, so collectives and shardings trace as they will run), with every output
per replica. That one jaxpr then serves twice without calling ``fn`` again:

1. ``invariance.varying_outputs`` reads it to decide which outputs every replica computes
   identically (returned as replicated arrays, TensorFlow's ``Mirrored``) and which differ
   (returned as ``PerReplica``). Values ``fn`` closes over (arrays, a Keras model's weights) are
   the program's constants, which ``shard_map`` passes to every replica: the same everywhere.
2. The ``shard_map`` body is evaluated from the jaxpr inside a new ``shard_map`` whose output
   specs follow that decision, and jitted: the compiled step.

Closed-over values are captured when a structure is first compiled, as with ``jax.jit``: pass
values that change between calls (weights, a learning rate) as arguments. The exception are
variables that a *variable source* lists (``register_variable_source``; e.g. the Keras layer's
variables): a closed-over value that is such a variable's current value is read from the
variable again at every call, so an assignment between calls is seen.

A batch from a distributed dataset may be padded (uneven last batch); its real-row counts are
passed as one more replicated input and exposed inside ``fn`` through ``get_replica_context()``
(``num_valid_rows``, ``valid_mask``); per-replica outputs with the batch's padded row count
carry the same counts, so ``gather`` returns only real rows.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jax_core
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src.core import context
from stratax._src.distributed_input.values import Mirrored, PerReplica, is_distributed_leaf
from stratax._src.runtime import devices
from stratax._src.runtime.invariance import varying_outputs
from stratax._src.strategies.replica_context import (
    REPLICA_AXIS,
    BatchRows,
    ReplicaContext,
)

CACHE_SIZE = 64
_COUNTS_CACHE_SIZE = 16
PER_REPLICA, REPLICATED, STATIC = "per_replica", "replicated", "static"


# shard_map is manual over "replica" only; a "core" axis (model parallelism) is left to XLA.
MANUAL_AXES = frozenset({REPLICA_AXIS})
_variable_sources: list[Callable[[], Iterable[Any]]] = []


def register_variable_source(source: Callable[[], Iterable[Any]]) -> None:
    """Makes closed-over variables be read at every ``run`` call, not captured once.

    ``source()`` returns live variable objects: anything with a ``.value`` array, such as Keras
    variables. When a replica function is compiled, a value it closed over that *is* (the same
    object as) a listed variable's current ``.value`` becomes an input of the compiled step, fed
    with that variable's ``.value`` at every call, so ``variable.assign(...)`` between calls is
    seen, as TensorFlow reads variables by reference. Registering the same source twice is a
    no-op.
    """
    if source not in _variable_sources:
        _variable_sources.append(source)


def _live_variables() -> dict[int, Any]:
    """``id(variable.value) -> variable`` for every variable the sources list now."""
    found: dict[int, Any] = {}
    for source in _variable_sources:
        for variable in source():
            found[id(variable.value)] = variable
    return found


@dataclasses.dataclass(frozen=True)
class CompiledRun:
    """A compiled step: ``call(*dynamic[, row_counts], *variable values)`` gives the flat outputs.

    ``variables`` are the closed-over variables read at every call (see
    ``register_variable_source``).
    """

    call: Callable[..., Any]
    out_tree: Any
    out_varying: tuple[bool, ...]
    variables: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Arguments:
    """The flattened arguments of one ``run`` call, sorted by kind."""

    leaves: list[Any]
    treedef: Any
    kinds: list[str]
    dynamic: list[Any]
    statics: list[Any]
    valid_rows: tuple[int, ...] | None
    padded_rows: int | None


class RunCompiler:
    """Traces, compiles, caches and calls replica functions over one strategy's mesh.

    Args:
        strategy: the strategy whose ``run`` this serves (its ``ReplicaContext``s name it).
        mesh: the strategy's mesh, with the ``"replica"`` axis.
        to_global: turns a ``PerReplica``'s stacked value (a device array or this process's
            host block) into a global array sharded over the replicas.
        cache_size: how many compiled steps to keep (least recently used is dropped).
    """

    def __init__(
        self,
        strategy: Any,
        mesh: Mesh,
        to_global: Callable[[Any], jax.Array],
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self._strategy = strategy
        self._mesh = mesh
        self._num_replicas = int(mesh.shape[REPLICA_AXIS])
        self._to_global = to_global
        self._replicated = NamedSharding(mesh, P())
        self._cache: collections.OrderedDict[Any, CompiledRun] = collections.OrderedDict()
        self._cache_size = cache_size
        self._counts_cache: dict[tuple[int, ...], jax.Array] = {}

    def run(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Runs ``fn(*args, **kwargs)`` on every replica; returns its outputs (see module doc)."""
        arguments = self._classify(tuple(args), kwargs)
        compiled = self._lookup(fn, arguments)
        placed = [
            self._to_global(x) if kind == PER_REPLICA else devices.place(x, self._replicated)
            for x, kind in zip(arguments.dynamic, _dynamic_kinds(arguments.kinds), strict=True)
        ]
        if arguments.valid_rows is not None:
            placed.append(self._row_counts(arguments.valid_rows))
        # A variable may live on another strategy's devices (a model built under a wider
        # strategy, run here): its value joins this step replicated on this mesh.
        values = [devices.place(variable.value, self._replicated)
                  for variable in compiled.variables]
        flat = compiled.call(*placed, *values)
        wrapped = [
            self._wrap(x, arguments) if varying else x
            for x, varying in zip(flat, compiled.out_varying, strict=True)
        ]
        return jax.tree.unflatten(compiled.out_tree, wrapped)

    def _row_counts(self, valid_rows: tuple[int, ...]) -> jax.Array:
        """The real-row counts as a replicated device array (kept: a few patterns recur)."""
        counts = self._counts_cache.get(valid_rows)
        if counts is None:
            if len(self._counts_cache) >= _COUNTS_CACHE_SIZE:
                self._counts_cache.clear()
            counts = jax.device_put(np.asarray(valid_rows, np.int32), self._replicated)
            if not isinstance(counts, jax.core.Tracer):  # traced: inside the user's jax.jit
                self._counts_cache[valid_rows] = counts
        return counts

    def cache_info(self) -> int:
        """How many compiled steps the cache holds."""
        return len(self._cache)

    # ----------------------------------------------------------------- arguments
    def _classify(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Arguments:
        leaves, treedef = jax.tree.flatten((args, kwargs), is_leaf=is_distributed_leaf)
        kinds, dynamic, statics = [], [], []
        row_sets: set[tuple[tuple[int, ...], int]] = set()
        for leaf in leaves:
            if isinstance(leaf, PerReplica):
                if leaf.num_replicas != self._num_replicas and not isinstance(
                    leaf.stacked, np.ndarray
                ):
                    raise ValueError(
                        f"A PerReplica argument has {leaf.num_replicas} components but "
                        f"{self._strategy!r} has {self._num_replicas} replicas; distribute the "
                        "value with this strategy."
                    )
                kinds.append(PER_REPLICA)
                dynamic.append(leaf.stacked)
                if leaf.valid_rows is not None:
                    row_sets.add((leaf.valid_rows, int(leaf.stacked.shape[1])))
            elif isinstance(leaf, Mirrored):
                kinds.append(REPLICATED)
                dynamic.append(jnp.asarray(leaf.value))
            elif isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
                kinds.append(REPLICATED)
                dynamic.append(leaf)
            else:
                kinds.append(STATIC)
                statics.append(leaf)
        if len(row_sets) > 1:
            raise ValueError(
                "The arguments of `run` hold parts of different uneven batches (real rows per "
                f"replica, padded rows: {sorted(row_sets)}); pass the parts of one distributed "
                "batch per call."
            )
        valid_rows, padded = row_sets.pop() if row_sets else (None, None)
        return _Arguments(leaves, treedef, kinds, dynamic, statics, valid_rows, padded)

    def _wrap(self, stacked: Any, arguments: _Arguments) -> PerReplica:
        """A varying output; one with the batch's padded row count carries its real rows."""
        padded = arguments.padded_rows
        if padded is not None and stacked.ndim >= 2 and stacked.shape[1] == padded:
            return PerReplica(stacked, arguments.valid_rows)
        return PerReplica(stacked)

    # ----------------------------------------------------------------- compile
    def _lookup(self, fn: Callable[..., Any], arguments: _Arguments) -> CompiledRun:
        key = (
            fn,
            arguments.treedef,
            tuple(arguments.kinds),
            _static_key(arguments.statics),
            tuple((tuple(x.shape), x.dtype) for x in arguments.dynamic),  # dtype, not str(dtype)
            arguments.valid_rows is not None,
        )
        compiled = self._cache.get(key)
        if compiled is not None:
            self._cache.move_to_end(key)
            return compiled
        compiled = self._compile(fn, arguments)
        self._cache[key] = compiled
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return compiled

    def _compile(self, fn: Callable[..., Any], arguments: _Arguments) -> CompiledRun:
        kinds = arguments.kinds
        masked = arguments.valid_rows is not None
        in_flags = [kind == PER_REPLICA for kind in _dynamic_kinds(kinds)] + [False] * masked

        def replica_body(*local: Any) -> Any:
            """``fn`` on one replica's values; every output gets a leading replica axis of 1."""
            values = iter(x[0] if per else x for x, per in zip(local, in_flags, strict=True))
            rebuilt = [leaf if kind == STATIC else next(values)
                       for kind, leaf in zip(kinds, arguments.leaves, strict=True)]
            rows = BatchRows(next(values), arguments.padded_rows) if masked else None
            call_args, call_kwargs = jax.tree.unflatten(arguments.treedef, rebuilt)
            replica = ReplicaContext(self._strategy, traced=True, batch_rows=rows)
            with context.replica_context_scope(replica):
                out = fn(*call_args, **call_kwargs)
            return jax.tree.map(lambda x: jnp.asarray(x)[None], out)

        avals = [  # A PerReplica's host block may hold only this process's replicas.
            jax.ShapeDtypeStruct((self._num_replicas, *x.shape[1:]) if per else x.shape, x.dtype)
            for x, per in zip(arguments.dynamic, in_flags, strict=False)
        ]
        if masked:
            avals.append(jax.ShapeDtypeStruct((self._num_replicas,), jnp.int32))
        in_specs = tuple(P(REPLICA_AXIS) if per else P() for per in in_flags)
        probe = jax.shard_map(replica_body, mesh=self._mesh, in_specs=in_specs,
                              out_specs=P(REPLICA_AXIS), axis_names=MANUAL_AXES,
                              check_vma=False)
        traced = _trace(probe, avals, fn)  # The one trace of ``fn`` for this structure.
        program = traced.jaxpr
        ops = self._strategy.cross_device_ops
        if self._num_replicas == 1:
            out_varying = tuple(False for _ in program.jaxpr.outvars)
        else:
            out_varying = tuple(varying_outputs(program, in_flags, REPLICA_AXIS,
                                                ops.unifying_calls))
        step, variables = _replay(program, out_varying, self._mesh, _live_variables(),
                                  ops.prepare)
        return CompiledRun(jax.jit(step), jax.tree.structure(traced.out_info), out_varying,
                           variables)


def _trace(probe: Callable[..., Any], avals: list[Any], fn: Callable[..., Any]) -> Any:
    """``jax.jit(probe).trace(*avals)``, with JAX's mesh-closure limitation explained."""
    try:
        return jax.jit(probe).trace(*avals)
    except ValueError as error:
        if "should match the mesh of sharding" not in str(error):
            raise
        name = getattr(fn, "__qualname__", repr(fn))
        raise ValueError(
            f"`strategy.run({name})`: the replica function closes over an array placed on the "
            "strategy's devices (a Keras variable created under `strategy.scope()`, or "
            "`jax.device_put(x, strategy.replicated_sharding())`) and indexes it; JAX cannot "
            "index such a closed-over array inside the SPMD step. Pass it as an argument "
            "instead, e.g. `strategy.run(fn, args=(batch, w))`, or close over a host copy "
            "(`np.asarray(w)`). JAX's message follows."
        ) from error


def _replay(
    program: Any, out_varying: tuple[bool, ...], mesh: Mesh, live: dict[int, Any],
    prepare: Callable[[Any], Any],
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """The traced ``shard_map`` again, from its jaxpr, with replicated outputs where invariant.

    ``program`` is ``jit(shard_map(replica_body))`` traced: one ``shard_map`` equation whose
    operands are the program's constants (values the replica function closed over, lifted by
    ``shard_map``), literals and inputs. Its body is evaluated, not re-traced from Python.
    Constants that are the current value of a variable in ``live`` become trailing inputs.
    ``prepare`` (the strategy's ``CrossDeviceOps.prepare``) rewrites the body for its transport.

    Returns:
        ``(step, variables)``: ``step(*inputs, *values of variables)`` gives the flat outputs.
    """
    (eqn,) = program.jaxpr.eqns
    if eqn.primitive.name != "shard_map":
        raise RuntimeError(f"internal: expected one shard_map equation, got {eqn.primitive.name}.")
    consts = dict(zip(program.jaxpr.constvars, program.consts, strict=True))
    positions = {var: i for i, var in enumerate(program.jaxpr.invars)}
    operands: list[tuple[str, Any]] = []
    variables: list[Any] = []
    for atom in eqn.invars:
        if isinstance(atom, jax_core.Literal):
            operands.append(("value", atom.val))
        elif atom in consts and id(consts[atom]) in live:
            operands.append(("input", len(positions) + len(variables)))
            variables.append(live[id(consts[atom])])
        elif atom in consts:
            operands.append(("value", consts[atom]))
        else:
            operands.append(("input", positions[atom]))
    body_jaxpr = prepare(eqn.params["jaxpr"])
    body = jax_core.jaxpr_as_fun(jax_core.ClosedJaxpr(body_jaxpr, ()))

    def per_replica(*local: Any) -> list[Any]:
        return [o if v else o[0] for o, v in zip(body(*local), out_varying, strict=True)]

    mapped = jax.shard_map(
        per_replica, mesh=mesh, in_specs=tuple(eqn.params["in_specs"]),
        out_specs=[P(REPLICA_AXIS) if v else P() for v in out_varying],
        axis_names=MANUAL_AXES, check_vma=False,
    )

    def step(*inputs: Any) -> list[Any]:
        return mapped(*(value if kind == "value" else inputs[value] for kind, value in operands))

    return step, tuple(variables)


def _dynamic_kinds(kinds: list[str]) -> list[str]:
    return [kind for kind in kinds if kind != STATIC]


def _static_key(statics: list[Any]) -> tuple[Any, ...]:
    key = []
    for value in statics:
        try:
            hash(value)
            key.append((type(value), value))
        except TypeError:
            key.append((type(value), id(value)))
    return tuple(key)
