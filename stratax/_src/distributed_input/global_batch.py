"""The one global-batch policy: how a batch is split over replicas, padded and masked.

Every path that cuts a global batch into per-replica batches — ``fit``, the custom-loop
datasets, ``InputContext`` and ``stratax train`` — calls this module, so they can never disagree.

- A batch size the *user chooses* (``batch_size=``, ``get_per_replica_batch_size``) must split
  evenly: ``check_divisible`` raises the one error message, with a suggestion.
- A batch that *arrives* with a row count that does not split (the short last batch of a
  dataset) is cut as TensorFlow cuts it: chunks of ``ceil(rows / replicas)`` rows in replica
  order, replicas past the end get no rows (6 rows over 4 replicas: 2, 2, 2, 0). SPMD needs
  equal shapes, so each replica's chunk is padded with zero rows to the common row count and the
  real-row counts travel with the batch (``PerReplica.valid_rows``); see docs/uneven_batches.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def suggested_batch(global_batch: int, num_replicas: int) -> int:
    """The nearest multiple of ``num_replicas`` not above ``global_batch`` (at least one each)."""
    return max(num_replicas, global_batch // num_replicas * num_replicas)


def check_divisible(global_batch: int, num_replicas: int, *, hint: str = "") -> None:
    """Raises ``ValueError`` unless ``global_batch`` splits evenly over ``num_replicas``.

    Args:
        global_batch: the batch size over all replicas that the user chose.
        num_replicas: ``num_replicas_in_sync``.
        hint: how to fix it in the caller's terms, with ``{batch}`` standing for the suggested
            size, e.g. ``"`model.fit(..., batch_size={batch})`"`` or ``"--batch-size {batch}"``.

    Raises:
        ValueError: e.g. "Global batch size 63 does not split over 2 replicas; use a multiple
            of 2, e.g. `model.fit(..., batch_size=62)`."
    """
    if global_batch % num_replicas == 0:
        return
    suggestion = suggested_batch(global_batch, num_replicas)
    example = f", e.g. {hint.format(batch=suggestion)}" if hint else ""
    raise ValueError(
        f"Global batch size {global_batch} does not split over {num_replicas} replicas; use a "
        f"multiple of {num_replicas}{example}."
    )


def per_replica_rows(rows: int, num_replicas: int) -> int:
    """The per-replica row count of a batch of ``rows``: ``ceil(rows / num_replicas)``."""
    return -(-rows // num_replicas)


def split_sizes(rows: int, num_replicas: int) -> list[int]:
    """The real rows of each replica, TensorFlow's cut: 6 rows over 4 replicas -> [2, 2, 2, 0]."""
    chunk = per_replica_rows(rows, num_replicas)
    return [min(chunk, max(rows - i * chunk, 0)) for i in range(num_replicas)]


def pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` with zero rows appended along axis 0 up to ``rows`` (unchanged if it has them)."""
    missing = rows - array.shape[0]
    if missing <= 0:
        return array
    return np.concatenate([array, np.zeros((missing, *array.shape[1:]), array.dtype)])


def split_and_pad(array: np.ndarray, num_replicas: int) -> np.ndarray:
    """A global batch as ``(num_replicas, ceil(rows / num_replicas), ...)``, zero padded at the end.

    Replica ``i`` gets rows ``[i*c, (i+1)*c)`` with ``c = ceil(rows / num_replicas)``; pair it with
    ``split_sizes(rows, num_replicas)`` for the real rows of each.
    """
    chunk = per_replica_rows(array.shape[0], num_replicas)
    return pad_rows(array, chunk * num_replicas).reshape(num_replicas, chunk, *array.shape[1:])


def stack_padded(parts: Sequence[np.ndarray], *, what: str) -> tuple[np.ndarray, list[int]]:
    """Stacks per-replica batches of possibly different row counts, padding to the longest.

    Args:
        parts: one array per replica; they must agree on every axis but the first.
        what: names the parts in the error, e.g. "the per-replica batches of step 3".

    Returns:
        ``(stacked, real_rows)``: ``(len(parts), max_rows, ...)`` and each part's row count.

    Raises:
        ValueError: the parts differ beyond their row count (names each replica's shape).
    """
    check_same_shapes([p.shape[1:] for p in parts], what=what, axis_note="beyond the batch axis")
    rows = [int(p.shape[0]) for p in parts]
    longest = max(rows)
    return np.stack([pad_rows(p, longest) for p in parts]), rows


def check_same_shapes(shapes: Sequence[Sequence[int]], *, what: str, axis_note: str = "") -> None:
    """Raises a ``ValueError`` naming each replica's shape unless all ``shapes`` are equal.

    stratax runs replicas as one SPMD program, so every replica's component of a value must have
    one shape (TensorFlow allows ragged components; stratax pads batches instead).
    """
    distinct = {tuple(s) for s in shapes}
    if len(distinct) <= 1:
        return
    listed = ", ".join(f"replica {i}: {tuple(s)}" for i, s in enumerate(shapes))
    note = f" {axis_note}" if axis_note else ""
    raise ValueError(
        f"{what[:1].upper()}{what[1:]} have different shapes{note} ({listed}); stratax runs "
        "the replicas as one SPMD program and needs one shape per component. Give every "
        "replica the same shape (pad, then mask or slice the padding off), or reduce/gather "
        "along axis 0 of a distributed batch, whose padding rows stratax removes."
    )

