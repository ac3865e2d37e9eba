"""A ``fit``/``evaluate``/``predict`` call under a strategy: where its batches go, and from where.

Several replicas (or several processes) use the strategy's Keras distribution: each batch is
split over the replicas, or given whole to each when it does not split. A one-replica strategy
needs no mesh: Keras runs as usual with the strategy's device as JAX's default device, which
keeps Keras' own single-device fast path.

The session also carries the resume point a ``BackupAndRestore`` found: the next epoch starts
``skip`` batches in, in the order of the interrupted epoch.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import keras
from keras.src.backend.jax import trainer as jax_trainer

from stratax._src.keras.distribution import StrategyDistribution
from stratax._src.keras.process_shard import ProcessShard
from stratax._src.strategies.base import Strategy


def uses_mesh(strategy: Strategy) -> bool:
    """Whether Keras must lay variables and batches out over the strategy's mesh."""
    return strategy.num_replicas_in_sync > 1 or strategy.is_multi_process


class DataSession:
    """State of one ``fit``/``evaluate``/``predict`` call of a model under ``strategy``."""

    def __init__(self, strategy: Strategy, distribution: StrategyDistribution | None) -> None:
        self.strategy = strategy
        self.distribution = distribution
        self._resume: tuple[int, int] | None = None

    def placement_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Where Keras puts variables and computations during the call."""
        if self.distribution is not None:
            return self.distribution.scope()
        return jax.default_device(self.strategy.devices[0])

    def resume_at(self, epoch: int, skip: int) -> None:
        """Makes the next epoch's data be epoch ``epoch``'s, ``skip`` batches in."""
        self._resume = (epoch, skip)

    def batches(self, data_adapter: Any) -> Iterator[Any]:
        """One epoch of batches from ``data_adapter``, placed on the replicas."""
        resume, self._resume = self._resume, None
        skip = resume[1] if resume else 0
        shard = getattr(data_adapter, "py_dataset", None)
        if isinstance(shard, ProcessShard):
            if resume:
                shard.start_epoch(resume[0])
            for batch, replicated in itertools.islice(shard.local_batches(), skip, None):
                yield self._place(batch, replicated)
            return
        yield from self._place_by_shape(itertools.islice(data_adapter.get_jax_iterator(), skip, None))

    def _place(self, batch: Any, replicated: bool) -> Any:
        if self.distribution is None:
            # Uncommitted arrays on the default device, as Keras makes them: committing them
            # would change jit's cache key between steps and recompile the step.
            return jax.tree.map(jnp.asarray, batch)
        sharding = self.distribution.placement(replicated)
        return jax.tree.map(lambda a: jax.make_array_from_process_local_data(sharding, a), batch)

    def _place_by_shape(self, batches: Iterator[Any]) -> Iterator[Any]:
        if self.distribution is None:
            yield from batches
            return
        distribution = self.distribution
        layouts, shapes = None, None
        for batch in batches:
            key = tuple(tuple(leaf.shape) for leaf in jax.tree.leaves(batch))
            if key != shapes:
                layouts = keras.tree.map_structure(
                    lambda d: None if d is None
                    else distribution.get_data_layout(d.shape).backend_layout,
                    batch,
                )
                shapes = key
            yield jax_trainer._distribute_data(batch, layouts)


class _Sessions(threading.local):
    def __init__(self) -> None:
        self.stack: list[DataSession] = []


_sessions = _Sessions()


def active() -> DataSession | None:
    """The innermost running session of this thread, if any."""
    return _sessions.stack[-1] if _sessions.stack else None


@contextlib.contextmanager
def running(session: DataSession) -> Iterator[DataSession]:
    """Makes ``session`` active (and its placement current) for the block."""
    _sessions.stack.append(session)
    try:
        with session.placement_scope():
            yield session
    finally:
        _sessions.stack.pop()
