"""Packing many small tensors into few flat buffers before a collective.

XLA's CPU runtime turns an all-reduce of N tensors (even when its combiner has merged them into
one tuple all-reduce) into N calls of the transport, one after the other; between processes
each gloo call pays a full network round trip, whatever the size (docs/design/performance.md).
Concatenating the tensors of one dtype into flat buffers of at
most ``bytes_per_pack`` bytes, reducing those, and slicing the results back costs one copy in
and one out (memcpy speed) and saves N - packs round trips. The sums are the same numbers in
the same order, so results do not change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# Default pack size when CommunicationOptions(bytes_per_pack=0) (TensorFlow's "automatic").
DEFAULT_BYTES_PER_PACK = 32 << 20


def plan_packs(shapes_dtypes: list[tuple[tuple[int, ...], Any]], bytes_per_pack: int
               ) -> list[list[int]]:
    """Groups leaf indices into packs: same dtype, in order, at most ``bytes_per_pack`` bytes each.

    A leaf larger than ``bytes_per_pack`` forms a pack of its own (it is not split).

    Example::

        plan_packs([((4,), f32), ((2, 2), f32), ((3,), i32)], 64)   # [[0, 1], [2]]
    """
    limit = bytes_per_pack if bytes_per_pack > 0 else DEFAULT_BYTES_PER_PACK
    packs: list[list[int]] = []
    open_pack: dict[Any, tuple[list[int], int]] = {}
    for index, (shape, dtype) in enumerate(shapes_dtypes):
        size = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        key = np.dtype(dtype)
        current = open_pack.get(key)
        if current is not None and current[1] + size <= limit:
            current[0].append(index)
            open_pack[key] = (current[0], current[1] + size)
            continue
        pack = [index]
        packs.append(pack)
        open_pack[key] = (pack, size)
    return packs


@dataclasses.dataclass(frozen=True)
class Batched:
    """A transport that reduces a list of buffers in one call and packs them itself.

    ``reduce`` takes and returns the list; ``takes(dtype)`` says which leaves it is handed as
    they are (no concatenated copy: the shared-memory all-reduce copies them straight into its
    slots, several to a round); leaves of other dtypes reach it packed as usual.
    """

    reduce: Callable[[list[jax.Array]], list[jax.Array]]
    takes: Callable[[Any], bool]


def packed_collective(collective: Callable[[jax.Array], jax.Array], value: Any,
                      bytes_per_pack: int, batched: Batched | None = None) -> Any:
    """Applies an element-wise ``collective`` to every leaf of ``value`` through flat packs.

    ``collective`` must act element by element (psum, pmean, pmax, pmin), so applying it to a
    concatenation equals applying it to each part. Leaves that are alone in their pack are
    passed through unchanged (no copy). ``batched``, when given, reduces the list of all packs
    in one call instead (the shared-memory transport: one custom call, so the packs cannot be
    reordered between processes), and is handed the leaves of the dtypes it ``takes``
    unpacked, before the packs of the others.
    """
    leaves, treedef = jax.tree.flatten(value)
    arrays = [jnp.asarray(leaf) for leaf in leaves]
    direct = {i for i, a in enumerate(arrays) if batched is not None and batched.takes(a.dtype)}
    rest = [i for i in range(len(arrays)) if i not in direct]
    packs = [[i] for i in sorted(direct)] + [
        [rest[j] for j in pack]
        for pack in plan_packs([(arrays[i].shape, arrays[i].dtype) for i in rest],
                               bytes_per_pack)]
    buffers = [arrays[pack[0]] if len(pack) == 1
               else jnp.concatenate([arrays[i].reshape(-1) for i in pack]) for pack in packs]
    reduced = batched.reduce(buffers) if batched is not None and buffers else [
        collective(b) for b in buffers]
    results: list[Any] = [None] * len(arrays)
    for pack, flat in zip(packs, reduced, strict=True):
        if len(pack) == 1:
            results[pack[0]] = flat
            continue
        offset = 0
        for i in pack:
            size = arrays[i].size
            results[i] = flat[offset:offset + size].reshape(arrays[i].shape)
            offset += size
    return jax.tree.unflatten(treedef, results)
