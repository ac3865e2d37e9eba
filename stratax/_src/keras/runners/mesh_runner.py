"""``MeshRunner``: Keras on the replicas of a data-parallel strategy (OneDevice, Mirrored, MWMS).

Several replicas (or several processes) use the strategy's Keras distribution
(``StrategyDistribution``: variables mirrored, each batch split over the ``"replica"`` axis or,
when it does not split, given whole to every replica). ``fit``'s train step all-reduces its
gradients in one packed collective (``keras.steps.packed_step``) where the model allows it, a group
of ``steps_per_execution`` such steps as one program (``keras.steps.group_step``); otherwise (e.g. a
model whose forward pass adds losses, which only the whole global batch gives) Keras' own step
runs over the global batch and XLA inserts one all-reduce per gradient. Whether a model packs
is decided once, from its first batch (:meth:`MeshRunner._packs`). A
one-replica strategy needs no mesh: Keras runs its own single-device path with the strategy's
device as JAX's default device (a 1-device mesh made Keras recompile its step every epoch).

On several CPU devices of one process the host dispatches at most a few steps ahead, which
avoids XLA's CPU all-reduce deadlock (``stratax._src.runtime.throttle``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax
import keras
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from stratax._src import seam
from stratax._src.core import env
from stratax._src.keras import binding, model_parallel
from stratax._src.keras.distribution import StrategyDistribution
from stratax._src.keras.runners.runner import KerasRunner, steps_per_execution
from stratax._src.keras.steps import (
    device_rows,
    epoch_logs,
    group_step,
    packed_step,
    sharded_update,
)
from stratax._src.runtime import distributed
from stratax._src.strategies.replica_context import REPLICA_AXIS

logger = logging.getLogger(__name__)


class MeshRunner(KerasRunner):
    """Runs Keras' step over the strategy's ``"replica"`` mesh (see the module docstring)."""

    def __init__(self, strategy: Any) -> None:
        super().__init__(strategy)
        uses_mesh = strategy.num_replicas_in_sync > 1 or strategy.is_multi_process
        self.distribution: Any = None
        if model_parallel.needs_model_parallel(strategy):
            self.distribution = model_parallel.distribution_for(strategy)
        elif uses_mesh:
            self.distribution = StrategyDistribution(strategy)
        self._split = NamedSharding(strategy.mesh, P(REPLICA_AXIS))
        self._whole = NamedSharding(strategy.mesh, P())
        # Where fit's kept arrays go (keras.steps.device_rows): every replica, or the one device.
        self._resident_sharding = (self._whole if self.distribution is not None
                                   else jax.sharding.SingleDeviceSharding(strategy.devices[0]))
        self._on_cpu = all(device.platform == "cpu" for device in strategy.devices)
        binding.remember_mesh(strategy)

    def placement_scope(self) -> contextlib.AbstractContextManager[Any]:
        if self.distribution is not None:
            return self.distribution.scope()
        return jax.default_device(self.strategy.devices[0])

    def batches(self, local_batches: Iterator[tuple[Any, bool]]) -> Iterator[Any]:
        if self.distribution is None:
            if self._on_cpu:  # the step reads host numpy in place, as Keras' own loop feeds it
                yield from (batch for batch, _ in local_batches)
                return
            # Uncommitted, on the default device the placement scope sets: 3x cheaper per batch
            # than committing, and always the same kind, so the step's cache key is stable.
            for batch, _ in local_batches:
                yield jax.device_put(batch)
            return
        for batch, replicated in local_batches:
            sharding = self._whole if replicated else self._split
            yield jax.tree.map(lambda a, s=sharding: jax.make_array_from_process_local_data(s, a),
                               batch)

    def feed_batches(self, feed: Any, call: Any) -> Iterator[Any]:
        resident = self._resident(feed, call)
        if resident is None:
            return self.batches(feed.local_batches())
        return self._row_batches(resident, feed)

    def _row_batches(self, resident: device_rows.Resident, feed: Any) -> Iterator[Any]:
        for batch in resident.batches(feed.row_pass(), feed.layout):
            if isinstance(batch, device_rows.RowBatch):
                yield batch
            else:  # a batch that does not split over the replicas: fed whole, from the host
                yield from self.batches(iter([(batch, True)]))

    def _resident(self, feed: Any, call: Any) -> device_rows.Resident | None:
        """The arrays of ``fit``'s training input kept on the devices (once per call), or
        ``None``: another input, another step, or arrays over the budget."""
        if "resident" not in call.kept:
            arrays = feed.arrays() if feed is call.feed and call.method == "fit" else None
            sharding = self._resident_sharding
            kept = (arrays is not None and self._takes_rows(call.model, feed.peek)
                    and device_rows.fits(arrays, sharding.addressable_devices))
            call.kept["resident"] = device_rows.Resident(arrays, sharding) if kept else None
        return call.kept["resident"]

    def _takes_rows(self, model: Any, first_batch: Callable[[], Any]) -> bool:
        """Whether ``model``'s train step (:meth:`make_step`) takes ``RowBatch`` batches."""
        if self.distribution is None:
            return _jitted(model)
        return self._packs(model, first_batch)

    def _packs(self, model: Any, first_batch: Callable[[], Any]) -> bool:
        """Whether ``model``'s train step all-reduces in one packed collective.

        ``first_batch()`` gives one batch of the step's input, on which ``packed_step.eligible``
        traces the forward pass (once per model).
        """
        if not (isinstance(self.distribution, StrategyDistribution)
                and self.strategy.num_replicas_in_sync > 1):
            return False
        reason = packed_step.eligible(model, first_batch)
        if reason is not None:
            logger.debug("fit: the train step is Keras' own over the global batch, its "
                         "gradients all-reduced one by one: %s", reason)
        return reason is None

    def place_unconverted(self, batches: Iterator[Any]) -> Iterator[Any]:
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
            yield seam.distribute_data(batch, layouts)

    def make_step(self, model: Any, kind: str,
                  build: Callable[[Callable[..., Any]], Callable[..., Any]],
                  step_fn: Callable[..., Any]) -> Callable[..., Any]:
        iterator_step = self._iterator_step(model, kind, build, step_fn)
        if kind == "train" and epoch_logs.keeps_keras_logs(model):
            return epoch_logs.marking_state_logs(iterator_step)
        return iterator_step

    def _iterator_step(self, model: Any, kind: str,
                       build: Callable[[Callable[..., Any]], Callable[..., Any]],
                       step_fn: Callable[..., Any]) -> Callable[..., Any]:
        if self.distribution is None:
            device = self.strategy.devices[0]
            if kind == "train" and _jitted(model):
                keras_step, step_fn = step_fn, _taking_rows(step_fn)
                group = steps_per_execution(model)
                if group > 1:  # groups of batches kept on the device: one scanned program each
                    return _committed(group_step.grouped_steps(
                        group, lambda state, data: keras_step(state, device_rows.whole_batch(data)),
                        step_fn, lambda data: isinstance(data, device_rows.RowBatch)), device)
            return build(_committed(step_fn, device))
        if kind == "train":
            # The update's plan reads the optimizer's config, which Keras empties (with every
            # variable) once its loop runs: made now, used if the step packs.
            layout = self._update_plan(model)
            return _chosen_on_first_batch(
                lambda state, batch: self._train_step(model, build, step_fn, state, batch,
                                                      layout))
        return build(self._bounded(step_fn))

    def _train_step(self, model: Any, build: Callable[[Callable[..., Any]], Callable[..., Any]],
                    step_fn: Callable[..., Any], state: Any, first: Any,
                    layout: sharded_update.Plan | str) -> Callable[..., Any]:
        """The multi-replica ``iterator_step`` of ``fit``, chosen on its first call (``state``
        and ``first`` batch): the packed step (alone or in groups, with the update sharded by
        ``layout`` where it is a plan) when the model packs, else Keras' own."""
        if self._packs(model, lambda: first):
            compiled = packed_step.compiled_packed_step(model, self.strategy, state)
            step_fn = packed_step.packed_train_step(compiled, step_fn)
            group = steps_per_execution(model)
            if group > 1:
                shardings = packed_step.output_shardings(self.strategy, state)
                return self._bounded(group_step.grouped_steps(
                    group, compiled, step_fn, packed_step.splits_over_replicas, shardings,
                    self._sharded_update(model, layout, shardings)))
        return build(self._bounded(step_fn))

    def _update_plan(self, model: Any) -> sharded_update.Plan | str:
        """How a group program would shard ``model``'s optimizer update over the processes, or
        why it keeps the replicated update."""
        reason = sharded_update.why_not(model, self.strategy, steps_per_execution(model))
        if reason is not None:
            return reason
        return sharded_update.plan(model, self.strategy.num_replicas_in_sync)

    def _sharded_update(self, model: Any, layout: sharded_update.Plan | str,
                        shardings: Any) -> Any:
        """The group program with the optimizer update sharded over the processes
        (``keras.steps.sharded_update``) by ``layout``, or ``None`` (the replicated update), saying
        why once."""
        if isinstance(layout, str):
            logger.debug("fit: the optimizer update stays replicated: %s", layout)
            return None
        logger.info("fit: the optimizer update is sharded over the %d processes, its "
                    "all-reduce a reduce-scatter and an all-gather (%s=off turns it off)",
                    self.strategy.num_replicas_in_sync, env.STRATAX_SHARDED_UPDATE)
        return sharded_update.group_program(model, self.strategy, layout, shardings)

    def _bounded(self, step_fn: Callable[..., Any]) -> Callable[..., Any]:
        """``step_fn`` admitting its results to the strategy's dispatch window."""
        window = self.strategy.dispatch_window
        if window.size <= 0:
            return step_fn

        def bounded_step(state: Any, data: Any) -> Any:
            result = step_fn(state, data)
            window.admit(result[0])
            return result

        return bounded_step

    def call(self, run: Callable[[], Any]) -> Any:
        def run_to_the_last_step() -> Any:
            result = run()
            self.strategy.dispatch_window.drain()  # a step that failed late fails this call
            return result

        if self.strategy.is_multi_process:
            return distributed.translate_collective_errors(run_to_the_last_step)
        return run_to_the_last_step()

    def finish(self) -> None:
        self.strategy.dispatch_window.forget()  # drained by `call`, unless it failed


def _jitted(model: Any) -> bool:
    """Whether ``model``'s steps are jit-compiled (what the one-device row step needs)."""
    return model.jit_compile and not model.run_eagerly


def _chosen_on_first_batch(choose: Callable[[Any, Any], Callable[..., Any]]
                           ) -> Callable[..., Any]:
    """An ``iterator_step(state, iterator)`` that is ``choose(state, first batch)``'s, chosen on
    its first call (the batch is handed back to the chosen step with the rest of the
    iterator)."""
    chosen: list[Callable[..., Any]] = []

    def iterator_step(state: Any, iterator: Iterator[Any]) -> Any:
        if not chosen:
            first = next(iterator)  # StopIteration here ends the epoch, as in Keras' loop
            chosen.append(choose(state, first))
            iterator = itertools.chain([first], iterator)
        return chosen[0](state, iterator)

    return iterator_step


def _taking_rows(step_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``step_fn`` (jitted) that also takes ``RowBatch`` batches, gathered in its program."""
    def train_step(state: Any, data: Any) -> Any:  # Keras' name, for jit's logs and profiles
        return step_fn(state, device_rows.whole_batch(data))

    gathered = jax.jit(train_step, donate_argnums=0)

    def step(state: Any, data: Any) -> Any:
        if isinstance(data, device_rows.RowBatch):
            return gathered(state, data)
        return step_fn(state, data)

    return step


def _committed(step_fn: Callable[..., Any], device: Any) -> Callable[..., Any]:
    """``step_fn`` with its state committed to ``device``, so it compiles once.

    jit's cache key includes whether each argument is committed to a device. Keras hands over
    fresh, uncommitted state at the start of a call and after ``reset_metrics``; committing it
    (and the batches) keeps every call of the step on one compiled program. A state the step
    returned is already committed and passes through untouched, and so do the leaves of a new
    state tuple that are (Keras rebuilds the tuple every epoch from its variables, which hold
    the step's outputs: re-placing all of them cost host time at every epoch).
    """
    returned: list[Any] = [None]
    sharding = jax.sharding.SingleDeviceSharding(device)

    def step(state: Any, data: Any) -> Any:
        if state is not returned[0]:
            state = _placed_on(state, device, sharding)
        logs, new_state = step_fn(state, data)
        returned[0] = new_state
        return logs, new_state

    return step


def _placed_on(tree: Any, device: Any, sharding: Any) -> Any:
    """``tree`` with every leaf not already committed to ``device`` placed there (one batch)."""
    leaves, structure = jax.tree.flatten(tree)
    stale = [i for i, leaf in enumerate(leaves)
             if not (isinstance(leaf, jax.Array) and leaf.committed and leaf.sharding == sharding)]
    if not stale:
        return tree
    for i, placed in zip(stale, jax.device_put([leaves[i] for i in stale], device), strict=True):
        leaves[i] = placed
    return jax.tree.unflatten(structure, leaves)
