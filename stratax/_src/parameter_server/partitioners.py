"""Variable partitioners with TensorFlow's signatures and results.

A partitioner is called as ``partitioner(shape, dtype, axis=0)`` and returns the number of
shards per axis (only axis 0 is split, as in TensorFlow's ParameterServerStrategy). Shards are
contiguous blocks along axis 0; the first ``rows % n`` shards get one extra row, so 13 rows over
5 shards are 3, 3, 3, 2, 2 (``shard_sizes``).
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def _shape(shape: Any) -> list[int]:
    dims = list(shape.as_list() if hasattr(shape, "as_list") else shape)
    if not dims or any(d is None or int(d) < 0 for d in dims):
        raise ValueError(
            f"A partitioner needs a fully defined shape of rank >= 1, got {shape!r}; give the "
            "variable a known shape."
        )
    return [int(d) for d in dims]


def _itemsize(dtype: Any, bytes_per_string: int) -> int:
    name = getattr(dtype, "name", dtype)
    if name in ("string", "str", object):
        return bytes_per_string
    if hasattr(dtype, "itemsize") and not isinstance(dtype, type):
        return int(dtype.itemsize)
    return int(np.dtype(name).itemsize)


def _check_axis(axis: int, rank: int) -> None:
    if axis != 0:
        raise ValueError(f"Only axis 0 can be partitioned (TensorFlow's rule), got axis={axis}.")
    del rank


class Partitioner(abc.ABC):
    """Base class: ``__call__(shape, dtype, axis=0)`` returns the shard count of each axis."""

    @abc.abstractmethod
    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        """Returns the number of shards along each axis of a variable of ``shape``."""


class FixedShardsPartitioner(Partitioner):
    """A fixed number of shards (at most one per row).

    Example:
      >>> FixedShardsPartitioner(num_shards=2)([10, 3], "float32")
      [2, 1]
    """

    def __init__(self, num_shards: int) -> None:
        if not isinstance(num_shards, int) or num_shards < 1:
            raise ValueError(f"Argument `num_shards` must be a positive int, got {num_shards!r}.")
        self._num_shards = num_shards

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        _check_axis(axis, len(dims))
        result = [1] * len(dims)
        result[axis] = max(1, min(self._num_shards, dims[axis]))
        return result


class MinSizePartitioner(Partitioner):
    """As many shards as possible, each at least ``min_shard_bytes``, at most ``max_shards``.

    Example:
      >>> MinSizePartitioner(min_shard_bytes=4, max_shards=2)([6, 1], "float32")
      [2, 1]
    """

    def __init__(self, min_shard_bytes: int = 256 << 10, max_shards: int = 1,
                 bytes_per_string: int = 16) -> None:
        if min_shard_bytes < 1:
            raise ValueError("Argument `min_shard_bytes` must be positive. "
                             f"Received: {min_shard_bytes}")
        if max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received: {max_shards}")
        if bytes_per_string < 1:
            raise ValueError("Argument `bytes_per_string` must be positive. "
                             f"Received: {bytes_per_string}")
        self._min_shard_bytes = min_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        _check_axis(axis, len(dims))
        total = math.prod(dims) * _itemsize(dtype, self._bytes_per_string)
        result = [1] * len(dims)
        result[axis] = max(1, min(dims[axis], self._max_shards,
                                  math.ceil(total / self._min_shard_bytes)))
        return result


class MaxSizePartitioner(Partitioner):
    """As few shards as possible, each at most ``max_shard_bytes`` (``max_shards`` wins).

    Example:
      >>> MaxSizePartitioner(max_shard_bytes=4)([6, 1], "float32")
      [6, 1]
    """

    def __init__(self, max_shard_bytes: int, max_shards: int | None = None,
                 bytes_per_string: int = 16) -> None:
        if max_shard_bytes < 1:
            raise ValueError("Argument `max_shard_bytes` must be positive. "
                             f"Received {max_shard_bytes}")
        if max_shards is not None and max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received {max_shards}")
        if bytes_per_string < 1:
            raise ValueError("Argument `bytes_per_string` must be positive. "
                             f"Received: {bytes_per_string}")
        self._max_shard_bytes = max_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Any, dtype: Any, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        _check_axis(axis, len(dims))
        bytes_per_slice = (math.prod(dims) / max(dims[axis], 1)
                           * _itemsize(dtype, self._bytes_per_string))
        slices_per_shard = max(1, math.floor(self._max_shard_bytes / max(bytes_per_slice, 1e-12)))
        shards = math.ceil(dims[axis] / slices_per_shard)
        if self._max_shards:
            shards = min(self._max_shards, shards)
        result = [1] * len(dims)
        result[axis] = max(1, shards)
        return result


def shard_sizes(rows: int, num_shards: int) -> list[int]:
    """Rows of each contiguous axis-0 shard, TensorFlow's way: 13 over 5 -> [3, 3, 3, 2, 2]."""
    if num_shards < 1 or num_shards > max(rows, 1):
        raise ValueError(f"Cannot split {rows} rows into {num_shards} shards.")
    base, extra = divmod(rows, num_shards)
    return [base + 1 if i < extra else base for i in range(num_shards)]


def shard_offsets(sizes: Sequence[int]) -> list[int]:
    """Start row of each shard."""
    offsets, start = [], 0
    for size in sizes:
        offsets.append(start)
        start += size
    return offsets


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """The part of a partitioned variable one initializer call builds (TensorFlow's
    ``tf.distribute.experimental.partitioners.ShardInfo``): a table larger than the chief's
    memory is built one shard at a time.

    Example:
      >>> def init(shard_info):                                          # doctest: +SKIP
      ...     rows = np.arange(shard_info.offset[0], shard_info.offset[0] + shard_info.shape[0])
      ...     return np.repeat(rows[:, None], shard_info.shape[1], axis=1).astype("float32")
      >>> strategy.create_variable(init, shape=(10**8, 16), name="table")  # doctest: +SKIP
    """

    shape: tuple[int, ...]
    offset: tuple[int, ...]


def partition_aware(initializer: Any) -> bool:
    """True when ``initializer`` builds one shard at a time, as TensorFlow recognises it: a
    ``shard_info`` parameter, or ``partition_shape`` and ``partition_offset`` keyword
    arguments (named, or taken by ``**kwargs``)."""
    try:
        parameters = inspect.signature(initializer).parameters
    except (TypeError, ValueError):
        return False
    return "shard_info" in parameters or {"partition_shape", "partition_offset"} <= set(
        parameters) or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def build_shard(initializer: Callable[..., Any], name: str, start: int, rows: int,
                shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """One shard built by a partition-aware initializer (``partition_aware``), checked
    against its shape. TensorFlow's ``partition_shape``/``partition_offset`` form may return
    the whole variable instead, which is sliced (as TensorFlow does)."""
    info = ShardInfo(shape=(rows, *shape[1:]), offset=(start, *(0,) * (len(shape) - 1)))
    if "shard_info" in inspect.signature(initializer).parameters:
        part = np.asarray(initializer(shard_info=info), dtype=dtype)
    else:
        part = np.asarray(initializer(partition_shape=info.shape,
                                      partition_offset=info.offset), dtype=dtype)
        if part.shape == tuple(shape) != info.shape:
            part = part[start:start + rows]
    if part.shape != info.shape:
        raise ValueError(f"The initializer of {name!r} returned shape {part.shape} for "
                         f"{info}; it must return an array of shard_info.shape "
                         "(partition_shape).")
    return part


def partition_count(partitioner: Callable[..., Any], name: str, shape: tuple[int, ...],
                    dtype: np.dtype) -> int:
    """Shards along axis 0 that the partitioner asks for a variable of ``shape``, checked as
    TensorFlow checks it; more shards than rows are capped at the rows (as TensorFlow does).

    Raises:
        ValueError: the result is not one positive int per dimension with 1 past axis 0.
    """
    result = partitioner(shape, dtype)
    parts = list(result) if isinstance(result, (list, tuple, np.ndarray)) else None
    if (parts is None or len(parts) != len(shape)
            or not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool)
                       for p in parts)
            or parts[0] < 1 or any(p != 1 for p in parts[1:])):
        raise ValueError(
            f"variable_partitioner must return a list of {len(shape)} ints, the number of "
            f"shards along axis 0 (>= 1) and 1 for every other axis; for {name!r} of shape "
            f"{shape} it returned {result!r}. Partition along the first axis only.")
    return min(int(parts[0]), shape[0])
