"""The shared-memory collectives as traced custom calls (``shm_collectives`` sets up the segment
they run over): ``all_reduce``, and the ``all_gather`` and ``reduce_scatter`` of ``fit``'s
sharded update and of the hierarchical all-reduce.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from stratax._src import seam
from stratax._src.runtime.shm_collectives import DTYPES, EXCHANGE_TARGET, OPS, TARGET, state

_ALL_REDUCE, _GATHER, _SCATTER = 0, 1, 2  # csrc/shm_allreduce.cc's Mode


def unordered_if_alone(jaxpr: Any) -> Any:
    """``jaxpr`` (a traced ``Jaxpr``), with its shared-memory all-reduce no longer a JAX effect
    when it holds exactly one (see :func:`all_reduce`'s ``only_call``); else ``jaxpr`` itself.

    One call site inside a loop body is one call: the iterations run one after the other. A
    site in a ``scan`` that XLA unrolls may become several independent calls, so it counts as
    two (the effect stays), as do sites in two branches of a ``cond``.
    """
    if _call_sites(jaxpr) != 1:
        return jaxpr
    # A hierarchical all-reduce (hier_collectives) ends with the one TARGET call; its
    # reduce-scatter (EXCHANGE_TARGET) feeds it, so nothing can come between them.
    targets = (TARGET, EXCHANGE_TARGET) if state.hierarchical else (TARGET,)
    rewritten = seam.ffi_calls_without_side_effect(jaxpr, *targets)
    return jaxpr if rewritten is None else rewritten


def _call_sites(jaxpr: Any) -> int:
    sites = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "ffi_call" and eqn.params.get("target_name") == TARGET:
            sites += 1
        inner = sum(_call_sites(sub) for sub in seam.jaxprs_in_params(eqn.params.values()))
        unrolled = eqn.primitive.name == "scan" and eqn.params.get("unroll", 1) not in (1, False)
        sites += 2 * inner if unrolled else inner
    return sites


def covers(devices: Sequence[Any]) -> bool:
    """True when shm is set up and ``devices`` (a mesh's) are the one device of every process:
    the packed all-reduce over them goes through shared memory (flat or hierarchical)."""
    if not state.active:
        return False
    processes = sum(len(ids) for ids in state.hosts.members)
    return sorted(d.process_index for d in devices) == list(range(processes))


def supports(dtype: Any) -> bool:
    """True when the shared-memory all-reduce handles arrays of ``dtype``."""
    return np.dtype(dtype) in DTYPES


def all_reduce(op: str, arrays: Sequence[jax.Array], *, only_call: bool = False
               ) -> list[jax.Array]:
    """Reduces every array of ``arrays`` over all processes with one custom call (traced).

    ``op`` is ``"sum"``, ``"max"`` or ``"min"``; call it inside ``jax.shard_map`` over a mesh
    that :func:`covers`. Every process gets the same bits (slots are combined in rank order).

    The call is marked side-effecting, so XLA neither merges two of them nor runs two at once
    (processes must meet in the same order). That marking is also a JAX effect, which sends
    every call of the program through JAX's Python dispatch instead of its C++ fast path, which
    costs host time on every call (``docs/design/performance.md``).
    ``only_call=True`` drops it, for a caller whose program holds no other shared-memory
    all-reduce (``fit``'s packed step): nothing is then left to merge or reorder, and a call
    whose result no one uses is dropped from the same program on every process alike.
    :func:`unordered_if_alone` drops it after tracing, where the program is known.
    """
    state.traced_calls += 1
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    call = jax.ffi.ffi_call(TARGET, shapes, has_side_effect=not only_call)
    return list(call(*arrays, mode=np.int32(_ALL_REDUCE), op=np.int32(OPS[op]),
                     call_id=_call_id(op, shapes)))


def _call_id(kind: str, shapes: Sequence[Any]) -> np.int64:
    """The same on every process for the same collective: the C++ side checks it per round, so
    processes that disagree on what they exchange fail loudly instead of mixing tensors."""
    return np.int64(zlib.crc32(repr((kind, [(s.shape, str(s.dtype)) for s in shapes])).encode()))


def all_gather(arrays: Sequence[jax.Array], *, ends_all_reduce: bool = False,
               ordered: bool = False) -> list[jax.Array]:
    """Every process's 1-D ``arrays``, concatenated in process order, with one custom call
    (traced, inside ``jax.shard_map`` over a mesh that :func:`covers`).

    No JAX effect (C++ dispatch) unless ``ordered``: the caller orders its calls by data (each
    call's operands depend on the previous one's results), as ``fit``'s sharded update does
    (``keras.steps.sharded_update``). ``ends_all_reduce``: the last step of a hierarchical
    all-reduce, whose result is the same on every process; it goes under :data:`TARGET`'s name, so
    that :mod:`invariance` and :func:`unordered_if_alone` count it as the all-reduce it completes.
    """
    shapes = [jax.ShapeDtypeStruct((state.world * a.shape[0],), a.dtype) for a in arrays]
    call = jax.ffi.ffi_call(TARGET if ends_all_reduce else EXCHANGE_TARGET, shapes,
                            has_side_effect=ordered)
    return list(call(*arrays, mode=np.int32(_GATHER), op=np.int32(OPS["sum"]),
                     call_id=_call_id("gather", shapes)))


def reduce_scatter(arrays: Sequence[jax.Array], *, ordered: bool = False) -> list[jax.Array]:
    """Part ``rank`` (of ``world`` equal parts) of each 1-D array of ``arrays``, summed over the
    processes, with one custom call (traced, as :func:`all_gather`, with no JAX effect either):
    the same bits as that part of :func:`all_reduce`'s sum. ``ordered``: a JAX effect, as
    :func:`all_gather`'s."""
    state.scatters_traced += 1
    shapes = [jax.ShapeDtypeStruct((a.shape[0] // state.world,), a.dtype) for a in arrays]
    call = jax.ffi.ffi_call(EXCHANGE_TARGET, shapes, has_side_effect=ordered)
    return list(call(*arrays, mode=np.int32(_SCATTER), op=np.int32(OPS["sum"]),
                     call_id=_call_id("scatter", shapes)))
