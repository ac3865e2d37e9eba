"""The hierarchical all-reduce between CPU processes on several hosts (NCCL's and Horovod's).

With ``L`` processes on each of ``H`` hosts, a flat gloo all-reduce sends every process's bytes
around a ring that crosses the hosts. Here, inside one compiled program (traced in
``jax.shard_map`` over the strategy's replica axis):

1. **Reduce-scatter over shared memory** inside each host: local rank ``l`` receives part ``l``
   (of ``L``) of the host's sum (``shm_calls.reduce_scatter``, summed in local-rank order).
2. **Exchange between hosts over gloo**: each process swaps its part with the processes of the
   same local rank on the other hosts (``jax.lax.ppermute``, XLA's collective-permute, which
   gloo carries; the parts of one dtype in one buffer, one gloo call), so each process sends
   ``(H - 1) / L`` of the bytes across hosts, and the ``L`` processes of a host use the links
   in parallel. Each process then adds the ``H`` parts in host order, so all of them hold the
   same bits.
3. **All-gather over shared memory** inside each host: every process gets every part.

Every element is summed in the same order on every process (local ranks, then hosts), so the
processes agree bit for bit; the order differs from a flat sum's, so the result equals one
process to float rounding, as gloo's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stratax._src.runtime import shm_calls
from stratax._src.runtime.shm_collectives import state


def all_reduce_sum(arrays: Sequence[jax.Array], devices: Sequence[Any], axis: str, *,
                   only_call: bool = False) -> list[jax.Array]:
    """The sum of every array of ``arrays`` over all processes (traced, hierarchical).

    Args:
        arrays: this process's operands (dtypes that ``shm_calls.supports``).
        devices: the devices of ``axis`` in axis order (one per process, every process).
        axis: the ``shard_map`` axis name over ``devices``.
        only_call: the program holds no other shared-memory collective: no JAX effect (as
            ``shm_calls.all_reduce``'s ``only_call``). Otherwise both shared-memory steps
            are JAX effects, so that several all-reduces of one program meet in program order.
    """
    state.hierarchical_traced += 1
    local = state.world
    parts = shm_calls.reduce_scatter([_padded(a, local) for a in arrays],
                                           ordered=not only_call)
    summed = _unpacked(_sum_over_hosts(_packed(parts), devices, axis), parts)
    gathered = shm_calls.all_gather(summed, ends_all_reduce=True, ordered=not only_call)
    return [g[:a.size].reshape(a.shape) for g, a in zip(gathered, arrays, strict=True)]


def _padded(array: jax.Array, parts: int) -> jax.Array:
    flat = array.reshape(-1)
    extra = -flat.size % parts
    return jnp.pad(flat, (0, extra)) if extra else flat


def _packed(parts: list[jax.Array]) -> list[jax.Array]:
    """One buffer per dtype: XLA's CPU runtime calls gloo once per operand of a
    collective-permute, and each call is a round trip."""
    dtypes = sorted({p.dtype for p in parts}, key=str)
    return [jnp.concatenate([p for p in parts if p.dtype == d]) for d in dtypes]


def _unpacked(buffers: list[jax.Array], parts: list[jax.Array]) -> list[jax.Array]:
    """``parts``' shapes cut back out of :func:`_packed`'s buffers."""
    dtypes = sorted({p.dtype for p in parts}, key=str)
    offsets = dict.fromkeys(dtypes, 0)
    out = []
    for p in parts:
        start = offsets[p.dtype]
        out.append(buffers[dtypes.index(p.dtype)][start:start + p.size])
        offsets[p.dtype] = start + p.size
    return out


def _sum_over_hosts(parts: list[jax.Array], devices: Sequence[Any], axis: str
                    ) -> list[jax.Array]:
    """Each part summed with the same part of the other hosts' processes of this local rank,
    in host order."""
    hosts = state.hosts
    count = len(hosts.members)
    process_at = [d.process_index for d in devices]
    index_of = {p: i for i, p in enumerate(process_at)}
    received = [parts]  # received[s]: the parts of the host `s` before this one (cyclically)
    for shift in range(1, count):
        perm = [(i, index_of[hosts.peer(p, (hosts.host_of(p) + shift) % count)])
                for i, p in enumerate(process_at)]
        received.append(list(jax.lax.ppermute(tuple(parts), axis, perm)))
    host_at = jnp.asarray(np.array([hosts.host_of(p) for p in process_at], np.int32))
    mine = host_at[jax.lax.axis_index(axis)]
    # Host k's part arrived with shift (mine - k) mod H: put them in host order, then add.
    order = (mine - jnp.arange(count, dtype=jnp.int32)) % count
    totals = []
    for k in range(len(parts)):
        stacked = jnp.stack([r[k] for r in received])[order]
        total = stacked[0]
        for h in range(1, count):
            total = total + stacked[h]
        totals.append(total)
    return totals
