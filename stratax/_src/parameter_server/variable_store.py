"""The chief's record of a ``ParameterServerStrategy``'s variables, and where each shard lives.

``create`` places a new variable on the parameter servers (the least-loaded ps, or the one of
``colocate_vars_with``; shards when the partitioner says so) and sends its value, or asks each
ps to build its shards (a partition-aware initializer, a ``ShardRecipe``), so no process holds
a large variable whole. ``on_ps`` maps the Keras variables a step uses to their parameter-server
variables, creating them the first time. The chief keeps descriptions (``PSVariable``), never
values: ``value_now`` pulls them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from stratax._src.parameter_server import program
from stratax._src.parameter_server.partitioners import (
    build_shard,
    partition_aware,
    partition_count,
    shard_offsets,
    shard_sizes,
)
from stratax._src.parameter_server.per_worker_variables import PerWorkerVariable
from stratax._src.parameter_server.shard_init import ShardRecipe, remote_recipe
from stratax._src.parameter_server.tasks.optimizers import DEFAULT_SPARSE_UPDATES
from stratax._src.parameter_server.transport.ps_client import PSClients
from stratax._src.parameter_server.transport.rpc import RpcClient
from stratax._src.parameter_server.variables import (
    Placement,
    PSVariable,
    ShardedVariable,
    aggregation_name,
    initial_array,
)


class VariableStore:
    """The variables of one strategy: their placement, names and Keras counterparts.

    Args:
      ps: The clients of the parameter servers.
      partitioner: The strategy's ``variable_partitioner``, or ``None``.
      namespace: Gives the prefix of this strategy's names on the tasks (``shared_session``).
      read_per_worker: Gives each worker's value of a ``PerWorkerVariable`` (the coordinator's).
    """

    def __init__(self, ps: PSClients, partitioner: Callable[..., Sequence[int]] | None,
                 namespace: Callable[[], str],
                 read_per_worker: Callable[[PerWorkerVariable], list[np.ndarray]]) -> None:
        self._ps = ps
        self._partitioner = partitioner
        self._namespace = namespace
        self._read_per_worker = read_per_worker
        self.variables: list[PSVariable] = []
        self._names: set[str] = set()
        self.built_on_servers: set[str] = set()  # names of variables no process holds whole
        self._load = [0] * len(ps.clients)
        # id(Keras variable) -> (that variable, its PSVariable); the variable is kept alive.
        self._keras: dict[int, tuple[Any, PSVariable]] = {}
        # Keras variables marked per-worker, by id: the variable and its PerWorkerVariable
        # (made when a step first uses it, as Keras variables are placed).
        self._keras_per_worker: dict[int, tuple[Any, PerWorkerVariable | None]] = {}
        self._optimizers_set: set[tuple[str, str]] = set()

    # ----- creating -------------------------------------------------------------------------
    def create(self, initial_value: Any, name: str | None, trainable: bool, dtype: Any,
               shape: Sequence[int] | None, aggregation: Any, per_worker: bool,
               colocated_ps: int | None) -> PSVariable | PerWorkerVariable:
        """``strategy.create_variable``; ``colocated_ps``: the ps of ``colocate_vars_with``."""
        aggregation = aggregation_name(aggregation)
        recipe = initial_value if isinstance(initial_value, ShardRecipe) else None
        per_shard = recipe is not None or (callable(initial_value)
                                           and partition_aware(initial_value))
        if per_worker:
            if per_shard:
                raise ValueError(
                    f"create_variable({name!r}, per_worker=True) got a partition-aware "
                    "initializer; a per-worker variable is not partitioned: pass its value or "
                    "a callable without arguments.")
            value = initial_array(initial_value, name, dtype, shape)
            name = self._unique_name(name or "Variable")
            return PerWorkerVariable(name, f"{self._namespace()}{name}", value,
                                     self._read_per_worker)
        if per_shard:
            if shape is None:
                raise ValueError(
                    f"create_variable({name!r}): a partition-aware initializer builds one "
                    "shard at a time, so it needs the whole variable's shape=(rows, ...).")
            value = None
            full_shape, full_dtype = tuple(int(d) for d in shape), np.dtype(dtype or "float32")
        else:
            value = initial_array(initial_value, name, dtype, shape)
            full_shape, full_dtype = value.shape, value.dtype
        name = self._unique_name(name or "Variable")
        placements = self._place(name, full_shape, full_dtype, colocated_ps)
        kind = ShardedVariable if len(placements) > 1 else PSVariable
        var = kind(name, full_shape, full_dtype, trainable, placements, self.pull, self.assign,
                   aggregation)
        if value is not None:
            self._write("create", placements, value)
        elif recipe is not None:
            self._build_on_servers(recipe, placements, full_shape, full_dtype)
            self.built_on_servers.add(name)
        for p in placements if per_shard and recipe is None else ():
            self._write("create", [p], build_shard(initial_value, name, p.start, p.rows,
                                                      full_shape, full_dtype))
        self.variables.append(var)
        return var

    def _place(self, name: str, shape: tuple[int, ...], dtype: np.dtype,
               colocated_ps: int | None) -> list[Placement]:
        """The shards of a new variable and their ps: the partitioner's split, each shard on
        the least-loaded ps by bytes (``colocated_ps``: all on that one, unpartitioned)."""
        shards = [shape[0]] if shape else [1]
        if (self._partitioner is not None and colocated_ps is None and len(shape) >= 1
                and shape[0] > 1):
            shards = shard_sizes(shape[0],
                                 partition_count(self._partitioner, name, shape, dtype))
        row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        placements = []
        for i, (start, rows) in enumerate(zip(shard_offsets(shards), shards, strict=False)):
            ps = colocated_ps if colocated_ps is not None else min(
                range(len(self._load)), key=lambda p: (self._load[p], p))
            self._load[ps] += rows * row_bytes
            key = f"{self._namespace()}{name}" + (f"/part_{i}" if len(shards) > 1 else "")
            placements.append(Placement(ps, key, start, rows))
        return placements

    def _unique_name(self, name: str) -> str:
        candidate, n = name, 0
        while candidate in self._names:
            n += 1
            candidate = f"{name}_{n}"
        self._names.add(candidate)
        return candidate

    # ----- Keras variables ------------------------------------------------------------------
    def mark_per_worker(self, keras_variable: Any) -> None:
        """``strategy.mark_per_worker``."""
        if self.is_placed(keras_variable):
            raise ValueError(
                f"{keras_variable.path!r} is already on the parameter servers (a step used it): "
                "create it with per_worker_variable=True, before any step uses it.")
        self._keras_per_worker.setdefault(id(keras_variable), (keras_variable, None))

    def is_placed(self, variable: Any) -> bool:
        """Whether the Keras ``variable`` has its parameter-server variable already."""
        return id(variable) in self._keras

    def placed(self, variable: Any) -> Any:
        """The ``PSVariable`` of a placed Keras ``variable``, else ``variable`` itself."""
        return self._keras.get(id(variable), (None, variable))[1]

    def keras_pairs(self) -> list[tuple[Any, PSVariable]]:
        """Every placed Keras variable with its ``PSVariable``."""
        return list(self._keras.values())

    def placed_pairs(self, variables: Sequence[Any]) -> list[tuple[Any, PSVariable]]:
        """The placed ones of ``variables`` with their ``PSVariable``, less those built by
        their servers (their state never comes to the chief)."""
        return [self._keras[id(v)] for v in variables
                if id(v) in self._keras and remote_recipe(v) is None]

    def on_ps(self, variables: Any) -> Any:
        """Maps Keras variables in a pytree to their parameter-server variables (creating them
        from the Keras values on first use); ``PSVariable`` leaves pass through."""
        def convert(leaf: Any) -> Any:
            if isinstance(leaf, PSVariable) or not (hasattr(leaf, "path")
                                                    and hasattr(leaf, "assign")):
                return leaf
            local = self._keras_per_worker.get(id(leaf))
            if local is not None:
                if local[1] is None:
                    local = self._keras_per_worker[id(leaf)] = (leaf, self.create(
                        np.asarray(leaf.numpy()), leaf.path, True, None, None, "none",
                        per_worker=True, colocated_ps=None))
                return local[1]
            entry = self._keras.get(id(leaf))
            if entry is None:
                recipe = remote_recipe(leaf)  # built by its servers, never here
                ps_var = self.create(
                    np.asarray(leaf.numpy()) if recipe is None else recipe, leaf.path,
                    bool(getattr(leaf, "trainable", True)),
                    None if recipe is None else leaf.dtype,
                    None if recipe is None else tuple(leaf.shape),
                    getattr(leaf, "aggregation", None), per_worker=False, colocated_ps=None)
                entry = self._keras[id(leaf)] = (leaf, ps_var)
            return entry[1]

        return jax.tree_util.tree_map(convert, variables)

    def chosen(self, variables: Sequence[Any] | None) -> list[PSVariable]:
        """``variables`` (Keras ones mapped) for a checkpoint; ``None``: every variable."""
        return list(self.variables if variables is None else self.on_ps(list(variables)))

    def value_now(self, leaf: Any) -> np.ndarray:
        """A variable's value on the chief, outside scheduled steps (``strategy.read``)."""
        if id(leaf) in self._keras_per_worker:
            leaf = self.on_ps(leaf)
        leaf = self.placed(leaf)
        if isinstance(leaf, PSVariable):
            return leaf.numpy()
        if isinstance(leaf, PerWorkerVariable):
            raise RuntimeError(
                f"strategy.read({leaf.name}) outside ClusterCoordinator.schedule: a per-worker "
                f"variable has one value per worker; {leaf.name}.read_all() gives them, or read "
                "it inside strategy.run in a scheduled function.")
        if hasattr(leaf, "path") and hasattr(leaf, "assign"):  # a Keras variable no step used
            return np.asarray(leaf.numpy())
        raise TypeError(f"strategy.read expects variables created under the strategy, got "
                        f"{type(leaf).__name__}.")

    # ----- the parameter servers ------------------------------------------------------------
    def pull(self, var: PSVariable) -> np.ndarray:
        """``var``'s value now, from its shards."""
        return self._ps.pull([var.describe()])[0]

    def assign(self, var: PSVariable, value: np.ndarray) -> None:
        """Writes ``value`` over ``var``'s shards."""
        self._write("assign", var.placements, value)

    def set_optimizers(self, built: program.Program) -> None:
        """Tells each ps the optimizer of the shards a new program updates (once per shard)."""
        for text, (spec, variables) in built.optimizers.items():
            by_ps: dict[int, list[str]] = defaultdict(list)
            for var in variables:
                for p in var.placements:
                    if (p.key, text) not in self._optimizers_set:
                        by_ps[p.ps].append(p.key)
                        self._optimizers_set.add((p.key, text))
            sparse = spec.get("sparse_updates", DEFAULT_SPARSE_UPDATES)
            clean = {k: v for k, v in spec.items() if k != "sparse_updates"}
            for ps, names in by_ps.items():
                self._ps.clients[ps].call("set_optimizer", {"names": names, "spec": clean,
                                                            "sparse_updates": sparse})

    def _build_on_servers(self, recipe: ShardRecipe, placements: Sequence[Placement],
                          shape: tuple[int, ...], dtype: np.dtype) -> None:
        """Each ps builds its shards of a variable from ``recipe`` (one call per ps)."""
        by_ps: dict[int, list[Placement]] = defaultdict(list)
        for p in placements:
            by_ps[p.ps].append(p)

        def call(ps: int) -> Callable[[RpcClient], Any]:
            meta = {"names": [p.key for p in by_ps[ps]], "recipe": recipe.describe(),
                    "shape": list(shape), "dtype": dtype.name,
                    "starts": [p.start for p in by_ps[ps]],
                    "rows": [p.rows for p in by_ps[ps]]}
            return lambda c: c.call("build", meta)

        self._ps.each({ps: call(ps) for ps in by_ps})

    def _write(self, method: str, placements: Sequence[Placement], value: np.ndarray) -> None:
        """Sends each shard of ``value`` to its ps (``create`` or ``assign``), one call per ps."""
        names: dict[int, list[str]] = defaultdict(list)
        parts: dict[int, list[np.ndarray]] = defaultdict(list)
        base = placements[0].start  # ``value`` starts at the first placement's row (a shard's)
        for p in placements:
            names[p.ps].append(p.key)
            rows = slice(p.start - base, p.start - base + p.rows)
            parts[p.ps].append(value[rows] if value.ndim else value)

        def call(ps: int) -> Callable[[RpcClient], Any]:
            return lambda c: c.call(method, {"names": names[ps]}, parts[ps], stream=True)

        self._ps.each({ps: call(ps) for ps in names})
