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

# TensorFlow's ``VariableAggregation`` names, as Keras 3 spells them.
AGGREGATIONS = ("none", "sum", "mean", "only_first_replica")


def aggregation_name(aggregation: Any) -> str:
    """``aggregation`` as Keras' lower-case name: a string, ``None`` or an enum such as
    TensorFlow's ``tf.VariableAggregation.MEAN`` (its ``name``).

    Raises:
      ValueError: not one of ``AGGREGATIONS``.
    """
    if aggregation is None:
        return "none"
    name = getattr(aggregation, "name", aggregation)
    if isinstance(name, str) and name.lower() in AGGREGATIONS:
        return name.lower()
    raise ValueError(f"aggregation={aggregation!r} is not a variable aggregation; use one of "
                     f"{AGGREGATIONS} (or tf.VariableAggregation.<NAME>).")


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

    On the chief, outside scheduled steps, it reads like TensorFlow's variables: ``np.asarray(v)``,
    ``v[1:3]``, ``v + 1``, other arithmetic and comparisons pull the value (``==`` and ``!=``
    elementwise, as TensorFlow's; hashing stays by identity, as TensorFlow's ``ShardedVariable``
    hashes, so variables remain usable as dict keys); ``assign_add``/``assign_sub`` and the
    ``scatter_*`` family (``update``, ``add``, ``sub``, ``mul``, ``div``, ``max``, ``min``)
    update it: row-wise ones touch only the shards holding the rows, and repeated rows compound
    in order, as in TensorFlow.
    These updates are read-modify-write from the chief: make them between ``join()`` calls, not
    while scheduled steps push gradients to the same variable.

    Example:
      >>> v = strategy.create_variable(np.zeros((4, 2), "float32"), name="w")  # doctest: +SKIP
      >>> v.numpy().shape                                                       # doctest: +SKIP
      (4, 2)
    """

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, trainable: bool,
                 placements: Sequence[Placement], pull: Callable[[PSVariable], np.ndarray],
                 assign: Callable[[PSVariable, np.ndarray], None],
                 aggregation: str = "none") -> None:
        self.name = name
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.trainable = trainable
        self.aggregation = aggregation  # TensorFlow's VariableAggregation, Keras' spelling
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

    def assign_add(self, delta: Any) -> PSVariable:
        """Adds ``delta`` to the value; returns the variable (TensorFlow's ``assign_add``)."""
        return self.assign(self.numpy() + np.asarray(delta, dtype=self.dtype))

    def assign_sub(self, delta: Any) -> PSVariable:
        """Subtracts ``delta`` from the value; returns the variable."""
        return self.assign(self.numpy() - np.asarray(delta, dtype=self.dtype))

    def sparse_read(self, indices: Any) -> np.ndarray:
        """The rows at ``indices`` (TensorFlow's ``sparse_read``), pulled from their shards."""
        ids = np.asarray(indices).reshape(-1)
        rows = np.empty((ids.size, *self.shape[1:]), self.dtype)
        for shard, where, local in self._rows_by_shard(ids):
            rows[where] = shard.numpy()[local]
        return rows.reshape((*np.shape(indices), *self.shape[1:]))

    def scatter_update(self, sparse_delta: Any) -> PSVariable:
        """Sets rows: ``sparse_delta`` has ``indices`` and ``values`` (``tf.IndexedSlices``)."""
        return self._scatter(sparse_delta, lambda old, new: new)

    def scatter_add(self, sparse_delta: Any) -> PSVariable:
        """Adds ``sparse_delta.values`` to the rows at ``sparse_delta.indices``."""
        return self._scatter(sparse_delta, lambda old, new: old + new)

    def scatter_sub(self, sparse_delta: Any) -> PSVariable:
        """Subtracts ``sparse_delta.values`` from the rows at ``sparse_delta.indices``."""
        return self._scatter(sparse_delta, lambda old, new: old - new)

    def scatter_mul(self, sparse_delta: Any) -> PSVariable:
        """Multiplies the rows at ``sparse_delta.indices`` by ``sparse_delta.values``."""
        return self._scatter(sparse_delta, np.multiply)

    def scatter_div(self, sparse_delta: Any) -> PSVariable:
        """Divides the rows at ``sparse_delta.indices`` by ``sparse_delta.values`` as
        TensorFlow's ``scatter_div`` does: integers truncate toward zero, and a zero divisor is
        refused before any row changes.

        Raises:
          ValueError: ``sparse_delta.values`` holds a zero.
        """
        values = getattr(sparse_delta, "values", None)
        if values is not None and not np.all(np.asarray(values, dtype=self.dtype)):
            raise ValueError(f"scatter_div on {self.name!r}: sparse_delta.values holds a zero; "
                             "TensorFlow refuses a zero divisor too. Divide by non-zero values.")
        return self._scatter(sparse_delta, self._divide)

    @staticmethod
    def _divide(old: np.ndarray, new: np.ndarray) -> np.ndarray:
        """``old / new`` as TensorFlow's ``scatter_div`` computes it: C's integer division
        (toward zero, where numpy's ``//`` floors) for integer variables."""
        if np.issubdtype(np.result_type(old), np.integer):
            quotient = np.abs(old) // np.abs(new)
            return np.where((old < 0) != (new < 0), -quotient, quotient)
        return old / new

    def scatter_max(self, sparse_delta: Any) -> PSVariable:
        """Rows become the element-wise maximum of themselves and ``sparse_delta.values``."""
        return self._scatter(sparse_delta, np.maximum)

    def scatter_min(self, sparse_delta: Any) -> PSVariable:
        """Rows become the element-wise minimum of themselves and ``sparse_delta.values``."""
        return self._scatter(sparse_delta, np.minimum)

    def batch_scatter_update(self, sparse_delta: Any) -> PSVariable:
        """TensorFlow's ``batch_scatter_update`` on a variable: ``scatter_update`` along axis 0."""
        return self.scatter_update(sparse_delta)

    def _scatter(self, sparse_delta: Any,
                 combine: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> PSVariable:
        if not (hasattr(sparse_delta, "indices") and hasattr(sparse_delta, "values")):
            raise TypeError(f"scatter_* on {self.name!r} takes an object with .indices and "
                            f".values (e.g. tf.IndexedSlices), got {type(sparse_delta).__name__}.")
        ids = np.asarray(sparse_delta.indices).reshape(-1)
        values = np.asarray(sparse_delta.values, dtype=self.dtype).reshape(
            (ids.size, *self.shape[1:]))
        for shard, where, local in self._rows_by_shard(ids):
            value = shard.numpy()
            for position, row in zip(where, local, strict=True):  # in order: repeats compound
                value[row] = combine(value[row], values[position])
            shard.assign(value)
        return self

    def _rows_by_shard(self, ids: np.ndarray) -> Iterator[tuple[PSVariable, np.ndarray,
                                                                 np.ndarray]]:
        """For each shard holding some of ``ids``: the shard, the positions in ``ids`` and the
        rows inside the shard."""
        if not self.shape:
            raise ValueError(f"{self.name!r} is a scalar: it has no rows to read or scatter.")
        if ids.size and (ids.min() < 0 or ids.max() >= self.shape[0]):
            raise IndexError(f"Row indices of {self.name!r} must be in [0, {self.shape[0]}), "
                             f"got {ids.min()}..{ids.max()}.")
        for shard in self._shards():
            start, rows = shard.placements[0].start, shard.placements[0].rows
            where = np.flatnonzero((ids >= start) & (ids < start + rows))
            if where.size:
                yield shard, where, ids[where] - start

    def _shards(self) -> list[PSVariable]:
        return [self]

    @property
    def device(self) -> str:
        """The device of the (first) parameter server holding the variable, TensorFlow-style."""
        return f"/job:ps/replica:0/task:{self.placements[0].ps}/device:CPU:0"

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = self.numpy()
        return value if dtype is None else value.astype(dtype)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        pulled = [x.numpy() if isinstance(x, PSVariable) else x for x in inputs]
        return getattr(ufunc, method)(*pulled, **kwargs)

    def __getitem__(self, key: Any) -> np.ndarray:
        return self.numpy()[key]

    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        """Elementwise on the pulled values, as TensorFlow compares variables: a boolean array,
        or ``False`` for ``None`` and shapes that do not broadcast (TF's
        ``incompatible_shape_error=False``)."""
        return self._compare(other, np.equal, False)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        """Elementwise ``!=`` (``True`` for ``None`` and shapes that do not broadcast)."""
        return self._compare(other, np.not_equal, True)

    # By identity, as TensorFlow's ShardedVariable: stratax keeps variables in dicts and sets
    # (identity is checked before ``==`` there). A list's ``in``/``index`` use ``==``: find a
    # variable in a list with ``any(v is x for x in ...)``.
    __hash__ = object.__hash__

    def _compare(self, other: Any, ufunc: Any, mismatch: bool) -> Any:
        if other is None:
            return mismatch
        theirs = other.numpy() if isinstance(other, PSVariable) else np.asarray(other)
        try:
            return ufunc(self.numpy(), theirs)
        except ValueError:  # shapes that do not broadcast
            return mismatch

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
                 assign: Callable[[PSVariable, np.ndarray], None],
                 aggregation: str = "none") -> None:
        super().__init__(name, shape, dtype, trainable, placements, pull, assign, aggregation)
        self.variables = [
            PSVariable(f"{name}/part_{i}", (p.rows, *tuple(shape[1:])), dtype, trainable, [p],
                       pull, assign, aggregation)
            for i, p in enumerate(placements)
        ]

    def __iter__(self) -> Iterator[PSVariable]:
        return iter(self.variables)

    def _shards(self) -> list[PSVariable]:
        return self.variables

    def __len__(self) -> int:
        return len(self.variables)


def initial_array(initial_value: Any, name: str | None, dtype: Any,
                  shape: Sequence[int] | None) -> np.ndarray:
    """``initial_value`` (called first if callable) as an array of ``dtype`` (float32 for
    Python floats), checked against ``shape``."""
    if callable(initial_value):
        initial_value = initial_value()
    value = np.asarray(initial_value, dtype=dtype)  # no copy: tables may be large
    if value.dtype == np.float64 and dtype is None:
        value = value.astype(np.float32)
    if shape is not None and tuple(shape) != value.shape:
        raise ValueError(f"create_variable({name!r}): shape={tuple(shape)} but the "
                         f"initial value has shape {value.shape}.")
    return value


def _pulling(operator: Callable[..., Any], reflected: bool = False) -> Callable[..., Any]:
    def method(self: PSVariable, *other: Any) -> Any:
        operands = (*other, self.numpy()) if reflected else (self.numpy(), *other)
        return operator(*operands)
    return method


for _name, _operator in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                         ("truediv", np.true_divide), ("floordiv", np.floor_divide),
                         ("mod", np.mod), ("pow", np.power), ("matmul", np.matmul)]:
    setattr(PSVariable, f"__{_name}__", _pulling(_operator))
    setattr(PSVariable, f"__r{_name}__", _pulling(_operator, reflected=True))
for _name, _operator in [("neg", np.negative), ("pos", np.positive), ("abs", np.abs),
                         ("lt", np.less), ("le", np.less_equal), ("gt", np.greater),
                         ("ge", np.greater_equal)]:
    setattr(PSVariable, f"__{_name}__", _pulling(_operator))


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
