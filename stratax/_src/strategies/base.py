"""``Strategy``: the data-parallel API every synchronous strategy shares (TensorFlow's names).

A strategy owns a ``jax.sharding.Mesh`` with one axis, ``"replica"``, over its devices, or two,
``("replica", "core")``, when each replica spans several logical cores (model parallelism: the
replica function is SPMD over ``"replica"``; XLA partitions it over ``"core"``).
``run(fn, args)`` executes ``fn`` once per replica as SPMD (``jax.shard_map`` over that axis,
traced and compiled once per argument structure and shapes by ``run_compiler``); values move
between the per-replica and the cross-replica world as ``PerReplica`` (one value per replica) and
replicated ``jax.Array``s.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src.core import context
from stratax._src.core.reduce_op import ReduceOp
from stratax._src.distributed_input.distributed_dataset import (
    DistributedDataset,
    DistributedDatasetsFromFunction,
)
from stratax._src.distributed_input.global_batch import check_same_shapes
from stratax._src.distributed_input.input_context import InputContext, InputOptions, ValueContext
from stratax._src.distributed_input.values import Mirrored, PerReplica, is_distributed_leaf
from stratax._src.runtime import throttle
from stratax._src.runtime.devices import local_replica_ids, place, process_rank
from stratax._src.strategies import cross_replica, transport
from stratax._src.strategies.cross_device_ops import CrossDeviceOps
from stratax._src.strategies.cross_replica import normalize_axis, stack_axes
from stratax._src.strategies.extended import StrategyExtended
from stratax._src.strategies.replica_context import CORE_AXIS, REPLICA_AXIS, ReplicaContext
from stratax._src.strategies.run_compiler import RunCompiler
from stratax._src.strategies.run_options import check_run_options


class Strategy:
    """Base class of the data-parallel strategies: one replica per device of ``devices``.

    Use a subclass (``MirroredStrategy``, ``OneDeviceStrategy``, ...); this class holds what they
    share.

    Example:
        >>> strategy = sx.MirroredStrategy()
        >>> with strategy.scope():
        ...     model = make_model()            # variables mirrored on every replica
        >>> model.fit(x, y, batch_size=256)     # 256 = global batch
    """

    is_default = False  # True only for the strategy current outside any scope
    # Custom-loop batches keep one shape per epoch (a short last batch padded to the full one)
    # where every new shape is a new compilation (TPUs).
    _static_batch_shapes = False
    _extended_type: type[StrategyExtended] = StrategyExtended  # what ``extended`` gives

    def __init__(self, devices: Sequence[jax.Device], cores_per_replica: int | None = None,
                 layout_map: Any = None, cross_device_ops: CrossDeviceOps | None = None) -> None:
        """``devices`` in replica-major order; ``cores_per_replica`` adds a ``"core"`` mesh axis;
        ``layout_map`` (a Keras ``LayoutMap``) lays variables out over the mesh (see ``keras``);
        ``cross_device_ops`` replaces the collectives chosen for the mesh (``transport``)."""
        self._devices = list(devices)
        self._layout_map = layout_map
        cores = cores_per_replica or 1
        self._process_rank, self._num_processes = process_rank(self._devices)
        grid = np.array(self._devices, dtype=object)
        if cores_per_replica is None:
            self._mesh = Mesh(grid, (REPLICA_AXIS,))
        else:
            self._mesh = Mesh(grid.reshape(-1, cores), (REPLICA_AXIS, CORE_AXIS))
        replicas = grid.reshape(-1, cores)
        # A replica whose cores span processes is local to each of them (model parallelism
        # across processes): they feed it the same rows.
        self._local_ids = local_replica_ids(replicas)
        self._processes_per_replica = len({d.process_index for d in replicas[0]})
        self._cross_device_ops = transport.choose(self._mesh, cross_device_ops)
        self._replicated = NamedSharding(self._mesh, P())
        self._stacked = NamedSharding(self._mesh, P(REPLICA_AXIS))
        self._runner = RunCompiler(self, self._mesh, self._to_global)
        # Cross-replica results are replicated, so every process can read them.
        replicated = functools.partial(jax.jit, out_shardings=self._replicated)
        self._concat_real_rows = replicated(cross_replica.concat_real_rows, static_argnums=1)
        self._reduce_stacked = replicated(cross_replica.reduce_stacked, static_argnums=(1, 2))
        self._reduce_copies = replicated(
            functools.partial(cross_replica.reduce_copies, copies=self._mesh_replicas),
            static_argnums=(1, 2))
        self._gather_stacked = replicated(cross_replica.gather_stacked, static_argnums=1)
        self._window = throttle.window_for(self._devices, self._num_processes)

    # ----------------------------------------------------------------- properties
    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas run each step in lock-step (the ``"replica"`` mesh axis size)."""
        return self._mesh_replicas

    @property
    def _mesh_replicas(self) -> int:
        """Replicas of this process's ``run``: the ``"replica"`` mesh axis size (the values
        this class builds and reduces have one component per mesh replica, also where a
        subclass counts ``num_replicas_in_sync`` otherwise, as ``ParameterServerStrategy``)."""
        return self._mesh.shape[REPLICA_AXIS]

    @property
    def mesh(self) -> Mesh:
        """The ``jax.sharding.Mesh`` of the replicas (axis ``"replica"``)."""
        return self._mesh

    @property
    def layout_map(self) -> Any:
        """The Keras ``LayoutMap`` that splits variables over the mesh, or ``None`` (mirrored)."""
        return self._layout_map

    @property
    def processes_per_replica(self) -> int:
        """How many processes one replica's devices span: 1, unless model parallelism puts a
        replica's cores on several processes (they then feed it the same rows)."""
        return self._processes_per_replica

    @property
    def devices(self) -> tuple[jax.Device, ...]:
        return tuple(self._devices)

    @property
    def is_multi_process(self) -> bool:
        """True when the replicas span several processes (multi-worker)."""
        return self._num_processes > 1

    @property
    def process_rank(self) -> int:
        """This process's rank among the strategy's processes (0 on one process)."""
        return self._process_rank

    @property
    def num_processes(self) -> int:
        return self._num_processes

    @property
    def is_chief(self) -> bool:
        """True on the process that writes checkpoints and logs (process 0)."""
        return self._process_rank == 0

    @functools.cached_property
    def extended(self) -> StrategyExtended:
        """TensorFlow's ``strategy.extended``: which task checkpoints, the devices, reductions
        to a destination (see ``strategies.extended``)."""
        return self._extended_type(self)

    @property
    def cross_device_ops(self) -> CrossDeviceOps:
        """How the replicas combine values: the one object every step and ``ReplicaContext``
        asks, chosen when the strategy was built (``strategies.transport.choose``)."""
        return self._cross_device_ops

    @property
    def bytes_per_pack(self) -> int:
        """Size of the flat packs ``all_reduce`` fuses tensors into (0 = automatic, 32 MiB)."""
        return 0

    @property
    def dispatch_window(self) -> throttle.DispatchWindow:
        """The bound on steps in flight: several CPU devices in one process (XLA's CPU
        all-reduce hazard) and several processes (a failed step reaches Python within it)."""
        return self._window

    def replicated_sharding(self) -> NamedSharding:
        """Sharding that puts a full copy of a value on every replica."""
        return self._replicated

    def batch_sharding(self) -> NamedSharding:
        """Sharding that splits axis 0 of a value over the replicas."""
        return self._stacked

    # ----------------------------------------------------------------- contexts
    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """Makes this strategy current: Keras variables created in it are mirrored on every
        replica (placed on the parameter servers under ``ParameterServerStrategy``).

        Raises:
            MixedStrategyError: another strategy's scope is already active.
        """
        return context.strategy_scope(self)

    def default_replica_context(self) -> ReplicaContext:
        """The replica context of code running outside ``run`` with no scope active."""
        return ReplicaContext(self, traced=False)

    # ----------------------------------------------------------------- run
    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
    ) -> Any:
        """Runs ``fn(*args, **kwargs)`` once per replica, in lock-step, and returns its results.

        ``PerReplica`` arguments give each replica its own component; arrays and ``Mirrored``
        values are passed whole to every replica; other Python values are constants of the
        compiled step (a change recompiles, like a Python value in a ``tf.function``).
        ``fn`` is traced once per argument structure (see ``run_compiler``); values it closes
        over are the same on every replica and are captured when that structure is first
        compiled. Results that every replica computed identically (e.g. after ``all_reduce``)
        come back as replicated ``jax.Array``s; the others as ``PerReplica``.

        Raises:
            RuntimeError: called inside another ``run``.
            TypeError: ``options`` is not an ``sx.RunOptions``.
            ValueError: a ``PerReplica`` argument has the wrong number of replicas.
        """
        check_run_options(options)  # TensorFlow's options; XLA decides what they decided
        if context.in_replica_function():
            raise RuntimeError(
                "`strategy.run` was called inside a replica function; call it once, from the "
                "cross-replica context, and use `sx.get_replica_context()` inside."
            )
        out = self._runner.run(fn, tuple(args), dict(kwargs or {}))
        self._window.admit(out)
        return out

    def _to_global(self, stacked: Any) -> jax.Array:
        """A ``PerReplica``'s stacked value as a global array sharded over the replicas.

        Host blocks (``InputOptions(experimental_fetch_to_device=False)``) hold this process's
        replicas only and are placed here.
        """
        if isinstance(stacked, jax.Array):
            return place(stacked, self._stacked)
        block = np.asarray(stacked)
        local = len(self._local_ids)
        if block.ndim == 0 or block.shape[0] != local:
            raise ValueError(
                f"A host PerReplica value has leading size {block.shape[:1]}, but this process "
                f"runs {local} replica(s) of {self!r}; distribute it with this strategy."
            )
        shape = (self._mesh_replicas, *block.shape[1:])
        return jax.make_array_from_process_local_data(self._stacked, block, shape)

    # ----------------------------------------------------------------- reductions
    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """Combines a per-replica ``value`` across replicas (and along ``axis`` if given).

        ``axis=None`` reduces across replicas only; ``axis=k`` also reduces along dimension ``k``
        of each component, e.g. ``reduce(MEAN, per_example_losses, axis=0)`` is the mean over
        the whole global batch. A value that is the same on every replica counts once per
        replica, as TensorFlow's mirrored values do (``SUM`` multiplies it by the replica count).
        The padding rows of an uneven batch are left out (``axis=0`` reduces the real rows).

        Raises:
            ValueError: the components have different shapes (an uneven batch reduced with
                ``axis=None`` or along another axis than 0); the message names each replica's.
        """
        op = ReduceOp.from_string(reduce_op)

        def one(leaf: Any) -> Any:
            if isinstance(leaf, PerReplica) and leaf.is_padded:
                self._require_row_axis(leaf, axis, "reduce")
                return self._reduce_stacked(self._real_rows(leaf)[None], op, (0, 1))
            if isinstance(leaf, PerReplica):
                stacked = self._stacked_components(leaf)
                return self._reduce_stacked(stacked, op, stack_axes(axis, stacked.ndim - 1))
            # A replicated value is copied per replica inside the reducing program: one
            # dispatch (a custom loop reduces its loss every step).
            base = leaf.value if isinstance(leaf, Mirrored) else leaf
            return self._reduce_copies(base, op, stack_axes(axis, np.ndim(base)))

        return jax.tree.map(one, value, is_leaf=is_distributed_leaf)

    def _stacked_components(self, leaf: Any) -> Any:
        """A leaf as ``(num_replicas, ...)``: a replicated value counts once per replica."""
        if isinstance(leaf, PerReplica):
            return self._to_global(leaf.stacked)
        base = leaf.value if isinstance(leaf, Mirrored) else jnp.asarray(leaf)
        return jnp.broadcast_to(base, (self._mesh_replicas, *base.shape))

    def _real_rows(self, leaf: PerReplica) -> jax.Array:
        """The real rows of a padded ``PerReplica``, concatenated in replica order (replicated)."""
        return self._concat_real_rows(self._to_global(leaf.stacked), leaf.valid_rows)

    def _require_row_axis(self, leaf: PerReplica, axis: int | None, what: str) -> None:
        """Components of an uneven batch differ along axis 0: only axis 0 can combine them."""
        component_ndim = leaf.stacked.ndim - 1
        if axis is not None and normalize_axis(axis, component_ndim) == 0:
            return
        rest = tuple(leaf.stacked.shape[2:])
        check_same_shapes(
            [(rows, *rest) for rows in leaf.valid_rows or ()],
            what=f"the components passed to `{what}(..., axis={axis})` (an uneven batch)",
        )

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenates every replica's component of ``value`` along ``axis``, in replica order.

        The padding rows of an uneven batch are left out: ``gather(batch, axis=0)`` gives the
        real rows of the global batch, in order.

        Raises:
            ValueError: scalar components, ``axis`` out of range, or components of different
                shapes along another axis than the one gathered.
        """

        def one(leaf: Any) -> Any:
            if isinstance(leaf, PerReplica) and leaf.is_padded and leaf.stacked.ndim >= 2:
                self._require_row_axis(leaf, axis, "gather")
                return self._real_rows(leaf)
            stacked = self._stacked_components(leaf)
            if stacked.ndim < 2:
                raise ValueError(
                    "gather needs components with at least one dimension; received scalars. "
                    "Use `strategy.experimental_local_results(value)` or reshape to (1,)."
                )
            return self._gather_stacked(stacked, normalize_axis(axis, stacked.ndim - 1))

        return jax.tree.map(one, value, is_leaf=is_distributed_leaf)

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The components of ``value`` on this process's replicas, as a tuple (one per replica).

        A replicated value gives one identical entry per local replica; a pytree gives a tuple
        of pytrees. Components of an uneven batch show only their real rows.
        """
        local = self._local_ids

        def components(leaf: Any) -> list[Any]:
            if isinstance(leaf, PerReplica):
                if isinstance(leaf.stacked, jax.Array):
                    # One shard per replica (a replica's cores hold copies of its component).
                    shards = {s.index[0].start or 0: s for s in leaf.stacked.addressable_shards}
                    parts = [shards[start].data[0] for start in sorted(shards)]
                else:
                    parts = list(np.asarray(leaf.stacked))
                rows = leaf.valid_rows
                if rows is None:
                    return parts
                return [part[: rows[replica]] for part, replica in zip(parts, local, strict=True)]
            base = leaf.value if isinstance(leaf, Mirrored) else leaf
            return [base] * len(local)

        leaves, treedef = jax.tree.flatten(value, is_leaf=is_distributed_leaf)
        per_leaf = [components(leaf) for leaf in leaves]
        return tuple(
            jax.tree.unflatten(treedef, [c[r] for c in per_leaf]) for r in range(len(local))
        )

    # ----------------------------------------------------------------- input
    def experimental_distribute_dataset(
        self, dataset: Any, options: InputOptions | None = None
    ) -> DistributedDataset:
        """Splits each *global* batch of ``dataset`` over the replicas (``PerReplica`` batches)."""
        return DistributedDataset(dataset, self._mesh, options, self._static_batch_shapes)

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None = None
    ) -> DistributedDatasetsFromFunction:
        """Calls ``dataset_fn(InputContext)`` once per process; it yields per-replica batches."""
        return DistributedDatasetsFromFunction(dataset_fn, self._mesh, options,
                                               self._static_batch_shapes)

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """A ``PerReplica`` value from ``value_fn(ValueContext)``, called for each local replica."""
        n = self._mesh_replicas
        values = [value_fn(ValueContext(i, n)) for i in self._local_ids]

        def stack(*components: Any) -> PerReplica:
            arrays = [np.asarray(c) for c in components]
            check_same_shapes([a.shape for a in arrays],
                              what="the values `value_fn` returned for the replicas")
            block = np.stack(arrays)
            return PerReplica(
                jax.make_array_from_process_local_data(self._stacked, block, (n, *block.shape[1:]))
            )

        return jax.tree.map(stack, *values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_replicas_in_sync={self.num_replicas_in_sync})"
