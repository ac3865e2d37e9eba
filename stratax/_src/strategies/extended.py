"""``strategy.extended``: TensorFlow's ``StrategyExtended`` API, for programs written against it.

TensorFlow splits each strategy into a ``Strategy`` and a ``StrategyExtended`` twin; stratax
keeps one class per strategy, no twin, and gives every strategy this small view of it,
so that code such as ``if strategy.extended.should_checkpoint: model.save(...)`` runs
unchanged. Each answer is read from the strategy, which holds the state; the view holds none
but the ``colocate_vars_with`` stack of ``ParameterServerStrategy`` (its subclass).

What each strategy answers, as TensorFlow's (``should_save_summary`` as ``should_checkpoint``):

| strategy | ``should_checkpoint`` | ``worker_devices`` | ``parameter_devices`` |
| --- | --- | --- | --- |
| default, OneDevice, Mirrored | True | this process's replicas | the same |
| MultiWorkerMirrored | the chief, else worker 0 | this worker's replicas | the same |
| TPU | process 0 (each host runs the program) | this host's replicas | the same |
| ParameterServer | the chief (the only program) | the chief's device | the ``ps`` tasks |
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from stratax._src.core.reduce_op import ReduceOp
from stratax._src.distributed_input.values import Mirrored, PerReplica, is_distributed_leaf
from stratax._src.runtime.devices import resolve_device

_CREATOR_ATTR = "_stratax_created_in"  # a weak reference to the strategy whose scope built it


def mark_created(variable: Any, strategy: Any) -> None:
    """Records that ``variable`` was built inside ``strategy``'s scope (``scope()`` does it
    for Keras variables, ``create_variable`` for a parameter server's)."""
    object.__setattr__(variable, _CREATOR_ATTR, weakref.ref(strategy))


def creator(variable: Any) -> Any:
    """The strategy in whose scope ``variable`` was built, or ``None`` (outside any scope)."""
    ref = getattr(variable, _CREATOR_ATTR, None)
    return ref() if ref is not None else None


class StrategyExtended:
    """TensorFlow's ``strategy.extended`` for a data-parallel strategy (see the module table).

    Example:
        >>> strategy = sx.MultiWorkerMirroredStrategy()
        >>> if strategy.extended.should_checkpoint:   # the chief, or worker 0
        ...     model.save("model.keras")
    """

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy

    # ----------------------------------------------------------------- which task does what
    @property
    def should_checkpoint(self) -> bool:
        """Whether this task writes checkpoints: the chief (``strategy.is_chief``)."""
        return bool(self._strategy.is_chief)

    @property
    def should_save_summary(self) -> bool:
        """Whether this task writes summaries (TensorBoard logs): the same task as checkpoints."""
        return bool(self._strategy.is_chief)

    @property
    def experimental_should_init(self) -> bool:
        """Whether this task runs variable initializers: every process of a data-parallel
        strategy (their values are agreed collectively)."""
        return True

    @property
    def should_init(self) -> bool:
        """``experimental_should_init`` (TensorFlow's V1 name)."""
        return self.experimental_should_init

    @property
    def experimental_require_static_shapes(self) -> bool:
        """True where every new batch shape is a new compilation the strategy avoids (TPU):
        its custom-loop batches keep one shape per epoch, a short last batch padded."""
        return bool(self._strategy._static_batch_shapes)

    # ----------------------------------------------------------------- devices
    @property
    def worker_devices(self) -> tuple[jax.Device, ...]:
        """The devices this process computes replicas on, one per replica in replica order
        (the first core of a replica that spans several)."""
        mesh = self._strategy.mesh
        per_replica = mesh.devices.reshape(mesh.devices.shape[0], -1)[:, 0]
        here = jax.process_index()
        return tuple(d for d in per_replica if d.process_index == here)

    @property
    def parameter_devices(self) -> tuple[Any, ...]:
        """Where variables live: every replica's device (variables are mirrored)."""
        return self.worker_devices

    def non_slot_devices(self, var_list: Sequence[Any]) -> tuple[Any, ...]:
        """Where state that belongs to no one variable (an optimizer's step count) is placed
        for ``var_list``: every replica's device, as the variables themselves."""
        del var_list
        return self.parameter_devices

    # ----------------------------------------------------------------- variables
    def variable_created_in_scope(self, v: Any) -> bool:
        """Whether ``v`` was created inside this strategy's ``scope()`` (for the default
        strategy: outside every strategy's scope)."""
        owner = creator(v)
        if self._strategy.is_default:
            return owner is None or owner is self._strategy
        return owner is self._strategy

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Creates the variables made inside on the devices of ``colocate_with_variable``:
        under a data-parallel strategy every variable is mirrored on every replica, so they
        are already together; the variable is checked as TensorFlow does.

        Raises:
            ValueError: ``colocate_with_variable`` was not created in this strategy's scope.
        """
        self._check_own(colocate_with_variable, "colocate_vars_with")
        yield

    def value_container(self, value: Any) -> Any:
        """The variable that ``value`` is one device's component of: here a variable is one
        object over all replicas (no per-device components), so ``value`` itself."""
        return value

    def update(self, var: Any, fn: Callable[..., Any], args: Sequence[Any] = (),
               kwargs: dict[str, Any] | None = None, group: bool = True) -> Any:
        """Runs ``fn(var, *args, **kwargs)`` to update ``var`` from the cross-replica context,
        once (a mirrored variable is one object over all replicas) and returns its result.
        ``Mirrored`` arguments are passed as their value.

        Raises:
            TypeError: an argument is ``PerReplica`` (reduce it first, e.g. with
                ``strategy.extended.reduce_to``).
        """
        del group  # eager: ``fn``'s result is returned as it is
        call_args = (tuple(args), dict(kwargs or {}))
        for leaf in jax.tree.leaves(call_args, is_leaf=is_distributed_leaf):
            if isinstance(leaf, PerReplica):
                raise TypeError(
                    "strategy.extended.update got a PerReplica argument; an update needs one "
                    "value for the variable: reduce it first, e.g. "
                    "strategy.extended.reduce_to(sx.ReduceOp.SUM, value, var).")
        plain = jax.tree.map(lambda x: x.value if isinstance(x, Mirrored) else x, call_args,
                             is_leaf=is_distributed_leaf)
        return fn(var, *plain[0], **plain[1])

    # ----------------------------------------------------------------- reductions
    def reduce_to(self, reduce_op: ReduceOp | str, value: Any, destinations: Any,
                  options: Any = None) -> Any:
        """Combines ``value`` across replicas, as ``strategy.reduce(reduce_op, value)``, and
        places the result on ``destinations``: a variable or array (its placement), a device
        or its name (``"cpu:0"``), or the strategy's devices (every replica, the default).

        Raises:
            ValueError: ``destinations`` names no device of this process.
        """
        del options  # Accepted for TensorFlow compatibility (``CommunicationOptions``).
        return self._place(self._strategy.reduce(reduce_op, value), destinations)

    def batch_reduce_to(self, reduce_op: ReduceOp | str,
                        value_destination_pairs: Sequence[tuple[Any, Any]],
                        options: Any = None) -> list[Any]:
        """``reduce_to`` of each ``(value, destinations)`` pair, in order."""
        return [self.reduce_to(reduce_op, value, destinations, options)
                for value, destinations in value_destination_pairs]

    def _place(self, value: Any, destinations: Any) -> Any:
        if destinations is None or isinstance(destinations, (list, tuple)):
            return value  # every replica: reduced values are replicated already
        if isinstance(destinations, (str, jax.Device)):
            device = resolve_device(destinations)
            return jax.tree.map(lambda leaf: jax.device_put(_local_copy(leaf), device), value)
        held = getattr(destinations, "value", destinations)
        sharding = getattr(held, "sharding", None)
        if sharding is None:
            raise TypeError(
                f"reduce_to destinations must be a variable, an array, a device or its "
                f"name; received {type(destinations).__name__}.")

        def put(leaf: Any) -> Any:
            # The destination's devices; its layout only for a value of its own shape.
            same_shape = tuple(np.shape(leaf)) == tuple(np.shape(held))
            if isinstance(sharding, NamedSharding) and not same_shape:
                return jax.device_put(leaf, NamedSharding(sharding.mesh, PartitionSpec()))
            return jax.device_put(leaf, sharding)

        return jax.tree.map(put, value)

    def _check_own(self, variable: Any, what: str) -> None:
        if not self.variable_created_in_scope(variable):
            raise ValueError(
                f"{what} needs a variable created in this strategy's scope ({self._strategy!r}); "
                f"received {type(variable).__name__}: {variable!r}. Create it under "
                "`with strategy.scope():`.")


def _local_copy(leaf: Any) -> Any:
    """A replicated array spanning several processes as this process's copy, for one device
    (the other processes' copies are the same value)."""
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        return leaf.addressable_shards[0].data
    return leaf
