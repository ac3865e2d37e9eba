"""Variables that live on parameter servers, as the coordinator sees them.

A ``PSVariable`` is one array on one ps; a ``ShardedVariable`` is a list of ``PSVariable``
shards, contiguous blocks along axis 0 (TensorFlow's layout) on different ps. The coordinator
holds only these handles; the values stay on the servers (``numpy()`` pulls them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one shard lives: ps index, its key there, first row and row count."""

    ps: int
    key: str
    start: int
    rows: int


class PSVariable:
    """A variable stored on a parameter server (unpartitioned, or one shard of a
    ``ShardedVariable``).

    Example:
      >>> v = strategy.create_variable(np.zeros((4, 2), "float32"), name="w")  # doctest: +SKIP
      >>> v.numpy().shape                                                       # doctest: +SKIP
      (4, 2)
    """

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, trainable: bool,
                 placements: Sequence[Placement], pull: Callable[[PSVariable], np.ndarray],
                 assign: Callable[[PSVariable, np.ndarray], None]) -> None:
        self.name = name
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.trainable = trainable
        self.placements = list(placements)
        self._pull = pull
        self._assign = assign

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """Pulls the current value from the parameter server(s)."""
        return self._pull(self)

    def read_value(self) -> np.ndarray:
        """Same as ``numpy()`` (TensorFlow's name)."""
        return self.numpy()

    def assign(self, value: Any) -> PSVariable:
        """Overwrites the value on the parameter server(s); returns the variable (as
        TensorFlow's ``assign`` does)."""
        value = np.asarray(value, dtype=self.dtype)
        if value.shape != self.shape:
            raise ValueError(f"Cannot assign a value of shape {value.shape} to {self.name!r} "
                             f"of shape {self.shape}.")
        self._assign(self, value)
        return self

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (sent to workers inside programs)."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.name,
                "shards": [[p.ps, p.key, p.start, p.rows] for p in self.placements]}

    def __repr__(self) -> str:
        where = ", ".join(f"ps {p.ps}" for p in self.placements)
        return (f"<{type(self).__name__} {self.name!r} shape={self.shape} dtype={self.dtype} "
                f"on {where}>")


class ShardedVariable(PSVariable):
    """A variable split along axis 0 into contiguous shards on several parameter servers.

    ``variables`` lists the shards (each a ``PSVariable``); iterating yields them, as in
    TensorFlow. ``numpy()`` concatenates them.

    Example:
      >>> strategy = sx.ParameterServerStrategy(                       # doctest: +SKIP
      ...     resolver, variable_partitioner=sx.partitioners.FixedShardsPartitioner(2))
      >>> table = strategy.create_variable(np.zeros((13, 4)), name="t")  # doctest: +SKIP
      >>> [v.shape for v in table.variables]                            # doctest: +SKIP
      [(7, 4), (6, 4)]
    """

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, trainable: bool,
                 placements: Sequence[Placement], pull: Callable[[PSVariable], np.ndarray],
                 assign: Callable[[PSVariable, np.ndarray], None]) -> None:
        super().__init__(name, shape, dtype, trainable, placements, pull, assign)
        self.variables = [
            PSVariable(f"{name}/part_{i}", (p.rows, *tuple(shape[1:])), dtype, trainable, [p],
                       pull, assign)
            for i, p in enumerate(placements)
        ]

    def __iter__(self) -> Iterator[PSVariable]:
        return iter(self.variables)

    def __len__(self) -> int:
        return len(self.variables)


def describe_table(variables: Sequence[PSVariable], addresses: Sequence[str]) -> str:
    """A printable table: variable, shape, shard rows, ps (with address) and bytes."""
    lines = [f"{'variable':<32} {'shape':<16} {'shard':<16} {'ps':<24} {'bytes':>12}"]
    total = [0] * len(addresses)
    for var in variables:
        row_bytes = var.nbytes // max(var.shape[0], 1) if var.shape else var.nbytes
        for i, p in enumerate(var.placements):
            nbytes = row_bytes * p.rows if var.shape else var.nbytes
            total[p.ps] += nbytes
            shard = f"{i}: rows {p.start}-{p.start + p.rows - 1}" if var.shape else "-"
            lines.append(f"{var.name:<32} {var.shape!s:<16} {shard:<16} "
                         f"{f'ps {p.ps} {addresses[p.ps]}':<24} {nbytes:>12,}")
    for ps, nbytes in enumerate(total):
        lines.append(f"{'total':<32} {'':<16} {'':<16} "
                     f"{f'ps {ps} {addresses[ps]}':<24} {nbytes:>12,}")
    return "\n".join(lines)
