"""``Strategy``: the data-parallel API every synchronous strategy shares (TensorFlow's names).

A strategy owns a ``jax.sharding.Mesh`` with one axis, ``"replica"``, over its devices.
``run(fn, args)`` executes ``fn`` once per replica as SPMD (``jax.shard_map`` over that axis,
compiled once per argument structure and shapes); values move between the per-replica and the
cross-replica world as ``PerReplica`` (one value per replica) and replicated ``jax.Array``s.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src.core import context
from stratax._src.core.reduce_op import ReduceOp
from stratax._src.data.distributed_dataset import (
    DistributedDataset,
    DistributedDatasetsFromFunction,
)
from stratax._src.data.input_context import InputContext, InputOptions, ValueContext
from stratax._src.data.values import Mirrored, PerReplica, is_distributed_leaf
from stratax._src.runtime import throttle
from stratax._src.runtime.devices import local_replica_ids, process_rank
from stratax._src.runtime.invariance import varying_outputs
from stratax._src.strategies.replica_context import REPLICA_AXIS, ReplicaContext

_RUN_CACHE_SIZE = 64
_PER_REPLICA, _REPLICATED, _STATIC = "per_replica", "replicated", "static"


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

    def __init__(self, devices: Sequence[jax.Device]) -> None:
        self._devices = list(devices)
        self._local_ids = local_replica_ids(self._devices)
        self._process_rank, self._num_processes = process_rank(self._devices)
        self._mesh = Mesh(np.array(self._devices, dtype=object), (REPLICA_AXIS,))
        self._replicated = NamedSharding(self._mesh, P())
        self._stacked = NamedSharding(self._mesh, P(REPLICA_AXIS))
        self._run_cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        window = throttle.cpu_window_from_env() if throttle.needs_bound(self._devices) else 0
        self._window = throttle.DispatchWindow(window)

    # ----------------------------------------------------------------- properties
    @property
    def num_replicas_in_sync(self) -> int:
        """How many replicas run each step in lock-step (the ``"replica"`` mesh axis size)."""
        return len(self._devices)

    @property
    def mesh(self) -> Mesh:
        """The ``jax.sharding.Mesh`` of the replicas (axis ``"replica"``)."""
        return self._mesh

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

    @property
    def bytes_per_pack(self) -> int:
        """Size of the flat packs ``all_reduce`` fuses tensors into (0 = automatic, 32 MiB)."""
        return 0

    @property
    def dispatch_window(self) -> throttle.DispatchWindow:
        """The bound on steps in flight (non-zero only for several CPU devices in one process)."""
        return self._window

    def replicated_sharding(self) -> NamedSharding:
        """Sharding that puts a full copy of a value on every replica."""
        return self._replicated

    def batch_sharding(self) -> NamedSharding:
        """Sharding that splits axis 0 of a value over the replicas."""
        return self._stacked

    # ----------------------------------------------------------------- contexts
    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """Makes this strategy current: Keras variables created in it are mirrored on every replica.

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
        Results that every replica computed identically (e.g. after ``all_reduce``) come back as
        replicated ``jax.Array``s; the others as ``PerReplica``.

        Raises:
            RuntimeError: called inside another ``run``.
            ValueError: a ``PerReplica`` argument has the wrong number of replicas.
        """
        del options  # Accepted for TensorFlow compatibility (``RunOptions``); XLA decides.
        if context.in_replica_function():
            raise RuntimeError(
                "`strategy.run` was called inside a replica function; call it once, from the "
                "cross-replica context, and use `sx.get_replica_context()` inside."
            )
        kwargs = dict(kwargs or {})
        leaves, treedef = jax.tree.flatten((tuple(args), kwargs), is_leaf=is_distributed_leaf)
        kinds, dynamic, statics = self._classify(leaves)
        key = (fn, treedef, tuple(kinds), _static_key(statics),
               tuple((x.shape, str(x.dtype)) for x in dynamic))
        compiled = self._run_cache.get(key)
        if compiled is None:
            compiled = self._compile_run(fn, treedef, kinds, leaves, dynamic)
            self._run_cache[key] = compiled
            if len(self._run_cache) > _RUN_CACHE_SIZE:
                self._run_cache.popitem(last=False)
        else:
            self._run_cache.move_to_end(key)
        call, out_tree, out_varying = compiled
        placed = [
            jax.device_put(x, self._stacked if k == _PER_REPLICA else self._replicated)
            for x, k in zip(dynamic, (k for k in kinds if k != _STATIC), strict=True)
        ]
        flat = call(*placed)
        self._window.admit(flat)
        wrapped = [PerReplica(x) if v else x for x, v in zip(flat, out_varying, strict=True)]
        return jax.tree.unflatten(out_tree, wrapped)

    def _classify(self, leaves: list[Any]) -> tuple[list[str], list[Any], list[Any]]:
        kinds, dynamic, statics = [], [], []
        for leaf in leaves:
            if isinstance(leaf, PerReplica):
                if leaf.num_replicas != self.num_replicas_in_sync:
                    raise ValueError(
                        f"A PerReplica argument has {leaf.num_replicas} components but "
                        f"{self!r} has {self.num_replicas_in_sync} replicas; distribute the "
                        "value with this strategy."
                    )
                kinds.append(_PER_REPLICA)
                dynamic.append(leaf.stacked)
            elif isinstance(leaf, Mirrored):
                kinds.append(_REPLICATED)
                dynamic.append(jnp.asarray(leaf.value))
            elif isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
                kinds.append(_REPLICATED)
                dynamic.append(leaf)
            else:
                kinds.append(_STATIC)
                statics.append(leaf)
        return kinds, dynamic, statics

    def _compile_run(
        self,
        fn: Callable[..., Any],
        treedef: Any,
        kinds: list[str],
        leaves: list[Any],
        dynamic: list[Any],
    ) -> tuple[Callable[..., Any], Any, list[bool]]:
        out_tree_box: list[Any] = []

        def body(expand_flags: list[bool] | None, *local: Any) -> list[Any]:
            it = iter(local)
            rebuilt = []
            for kind, leaf in zip(kinds, leaves, strict=True):
                if kind == _PER_REPLICA:
                    rebuilt.append(next(it)[0])
                elif kind == _REPLICATED:
                    rebuilt.append(next(it))
                else:
                    rebuilt.append(leaf)
            args, kwargs = jax.tree.unflatten(treedef, rebuilt)
            with context.replica_context_scope(ReplicaContext(self, traced=True)):
                out = fn(*args, **kwargs)
            flat, out_tree = jax.tree.flatten(out)
            out_tree_box[:] = [out_tree]
            flat = [jnp.asarray(x) for x in flat]
            if expand_flags is None:
                return [x[None] for x in flat]
            return [x[None] if e else x for x, e in zip(flat, expand_flags, strict=True)]

        in_specs = tuple(P(REPLICA_AXIS) if k == _PER_REPLICA else P() for k in kinds if k != _STATIC)
        probe = jax.shard_map(
            lambda *a: body(None, *a), mesh=self._mesh, in_specs=in_specs,
            out_specs=P(REPLICA_AXIS), check_vma=False,
        )
        abstract = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in dynamic]
        traced = jax.make_jaxpr(probe)(*abstract)
        if self.num_replicas_in_sync == 1:
            out_varying = [False] * len(traced.jaxpr.outvars)
        else:
            inner = _shard_map_body(traced)
            in_flags = [k == _PER_REPLICA for k in kinds if k != _STATIC]
            out_varying = varying_outputs(inner, in_flags, REPLICA_AXIS)
        out_specs = [P(REPLICA_AXIS) if v else P() for v in out_varying]
        mapped = jax.shard_map(
            lambda *a: body(out_varying, *a), mesh=self._mesh, in_specs=in_specs,
            out_specs=out_specs, check_vma=False,
        )
        return jax.jit(mapped), out_tree_box[0], out_varying

    # ----------------------------------------------------------------- reductions
    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None = None) -> Any:
        """Combines a per-replica ``value`` across replicas (and along ``axis`` if given).

        ``axis=None`` reduces across replicas only; ``axis=k`` also reduces along dimension ``k``
        of each component, e.g. ``reduce(MEAN, per_example_losses, axis=0)`` is the mean over
        the whole global batch. A value that is the same on every replica counts once per
        replica, as TensorFlow's mirrored values do (``SUM`` multiplies it by the replica count).
        """
        op = ReduceOp.from_string(reduce_op)

        def one(leaf: Any) -> Any:
            stacked = self._stacked_components(leaf)
            axes = (0,) if axis is None else (0, _normalize_axis(axis, stacked.ndim - 1) + 1)
            return _REDUCERS[op](stacked, axis=axes)

        return jax.tree.map(one, value, is_leaf=is_distributed_leaf)

    def _stacked_components(self, leaf: Any) -> Any:
        """A leaf as ``(num_replicas, ...)``: a replicated value counts once per replica."""
        if isinstance(leaf, PerReplica):
            return leaf.stacked
        base = leaf.value if isinstance(leaf, Mirrored) else jnp.asarray(leaf)
        return jnp.broadcast_to(base, (self.num_replicas_in_sync, *base.shape))

    def gather(self, value: Any, axis: int) -> Any:
        """Concatenates every replica's component of ``value`` along ``axis``, in replica order."""

        def one(leaf: Any) -> Any:
            stacked = self._stacked_components(leaf)
            if stacked.ndim < 2:
                raise ValueError(
                    "gather needs components with at least one dimension; received scalars. "
                    "Use `strategy.experimental_local_results(value)` or reshape to (1,)."
                )
            k = _normalize_axis(axis, stacked.ndim - 1)
            moved = jnp.moveaxis(stacked, 0, k)
            return moved.reshape(*moved.shape[:k], -1, *moved.shape[k + 2 :])

        return jax.tree.map(one, value, is_leaf=is_distributed_leaf)

    def experimental_local_results(self, value: Any) -> tuple[Any, ...]:
        """The components of ``value`` on this process's replicas, as a tuple (one per replica).

        A replicated value gives one identical entry per local replica; a pytree gives a tuple
        of pytrees.
        """
        local = self._local_ids

        def components(leaf: Any) -> list[Any]:
            if isinstance(leaf, PerReplica):
                shards = sorted(leaf.stacked.addressable_shards, key=lambda s: s.index[0].start or 0)
                return [shard.data[0] for shard in shards]
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
        return DistributedDataset(dataset, self._mesh, options)

    def distribute_datasets_from_function(
        self, dataset_fn: Callable[[InputContext], Any], options: InputOptions | None = None
    ) -> DistributedDatasetsFromFunction:
        """Calls ``dataset_fn(InputContext)`` once per process; it yields per-replica batches."""
        return DistributedDatasetsFromFunction(dataset_fn, self._mesh, options)

    def experimental_distribute_values_from_function(
        self, value_fn: Callable[[ValueContext], Any]
    ) -> Any:
        """Builds a ``PerReplica`` value from ``value_fn(ValueContext)`` called for each local replica."""
        n = self.num_replicas_in_sync
        values = [value_fn(ValueContext(i, n)) for i in self._local_ids]

        def stack(*components: Any) -> PerReplica:
            block = np.stack([np.asarray(c) for c in components])
            return PerReplica(
                jax.make_array_from_process_local_data(self._stacked, block, (n, *block.shape[1:]))
            )

        return jax.tree.map(stack, *values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_replicas_in_sync={self.num_replicas_in_sync})"


_REDUCERS = {ReduceOp.SUM: jnp.sum, ReduceOp.MEAN: jnp.mean, ReduceOp.MAX: jnp.max,
             ReduceOp.MIN: jnp.min}


def _normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for per-replica values of rank {ndim}.")
    return axis % ndim


def _shard_map_body(closed: Any) -> Any:
    for eqn in closed.jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            return eqn.params["jaxpr"]
    raise RuntimeError("internal: the replica function did not trace to a shard_map.")


def _static_key(statics: list[Any]) -> tuple[Any, ...]:
    key = []
    for value in statics:
        try:
            hash(value)
            key.append((type(value), value))
        except TypeError:
            key.append((type(value), id(value)))
    return tuple(key)
