"""``MeshRunner``: Keras on the replicas of a data-parallel strategy (OneDevice, Mirrored, MWMS).

Several replicas (or several processes) use the strategy's Keras distribution
(``StrategyDistribution``: variables mirrored, each batch split over the ``"replica"`` axis or,
when it does not split, given whole to every replica). ``fit``'s train step all-reduces its
gradients in one packed collective (``keras.steps.packed_step``) where the model allows it, a group
of ``steps_per_execution`` such steps as one program (``keras.steps.group_step``); otherwise (e.g. a
model whose forward pass adds losses, which only the whole global batch gives) Keras' own step
runs over the global batch and XLA inserts one all-reduce per gradient. All of it is one step
plan (``keras.steps.plan``), chosen once per step function from its first batch
(:meth:`MeshRunner._plan`). A one-replica strategy needs no mesh: Keras runs its own
single-device step with the strategy's device as JAX's default device (a 1-device mesh made
Keras recompile its step every epoch).

On several CPU devices of one process the host dispatches at most a few steps ahead, which
avoids XLA's CPU all-reduce deadlock (``stratax._src.runtime.throttle``).
"""

from __future__ import annotations

import contextlib
import dataclasses
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
from stratax._src.keras.steps import plan as plan_lib
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
            # Uncommitted, on the default device the placement scope sets: cheaper per batch
            # than committing (docs/design/performance.md), and always the same kind, so the
            # step's cache key is stable.
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
        return self._why_not_packed(model, first_batch) is None

    def _why_not_packed(self, model: Any, first_batch: Callable[[], Any]) -> str | None:
        """Why ``model``'s train step cannot all-reduce in one packed collective, or ``None``.

        ``first_batch()`` gives one batch of the step's input, on which ``packed_step.eligible``
        traces the forward pass (once per model).
        """
        if not isinstance(self.distribution, StrategyDistribution):
            return "the variables are laid out for model parallelism"
        if self.strategy.num_replicas_in_sync <= 1:
            return "one replica"
        return packed_step.eligible(model, first_batch)

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
                  step_fn: Callable[..., Any]) -> plan_lib.PlannedStep:
        # The sharded update's layout reads the optimizer's config, which Keras empties (with
        # every variable) once its loop runs: made now, used if the plan packs.
        layout = (self._update_plan(model) if kind == "train" and self.distribution is not None
                  else None)
        return plan_lib.PlannedStep(
            lambda state, first_batch: self._plan(model, kind, step_fn, layout, state,
                                                  first_batch))

    def _plan(self, model: Any, kind: str, keras_step: Callable[..., Any],
              layout: sharded_update.Plan | str | None, state: Any,
              first_batch: Callable[[], Any]) -> tuple[plan_lib.StepPlan, plan_lib.StepPrograms]:
        """The step plan of ``model``'s ``kind`` steps, chosen on the first call (``state``,
        ``first_batch``), with its programs: the table in docs/design/step-plan.md."""
        group = steps_per_execution(model)
        plan = plan_lib.StepPlan(
            kind, group=group, state_logs=kind == "train" and epoch_logs.keeps_keras_logs(model))
        concatenate = (plan_lib.concatenation(_jitted(model))
                       if kind == "predict" and group > 1 else None)
        if self.distribution is None:  # one device: Keras' step, the state committed to it
            device = self.strategy.devices[0]
            plan = dataclasses.replace(plan, over=str(device), committed=True)
            if kind != "train" or not _jitted(model):
                return plan, plan_lib.StepPrograms(keras_step, device=device,
                                                   concatenate=concatenate)
            # Batches kept on the device gathered in a jitted step of their own; groups of
            # them as one scanned program each.
            gathering = jax.jit(_rows_of(keras_step), donate_argnums=0)
            grouped = (group_step.programs(_rows_of(keras_step)) if group > 1
                       else (None, None))
            return (dataclasses.replace(plan, rows=True, group_program=group > 1),
                    plan_lib.StepPrograms(keras_step, gathering, plan_lib.is_row_batch,
                                          *grouped, device=device))
        window = self.strategy.dispatch_window
        window = window if window.size > 0 else None
        replicas = self.strategy.num_replicas_in_sync
        plan = dataclasses.replace(plan, over=f"{replicas} replica(s)",
                                   window=window.size if window is not None else 0)
        why_not = self._why_not_packed(model, first_batch) if kind == "train" else None
        if kind != "train" or why_not is not None:
            if why_not is not None:
                plan = dataclasses.replace(plan, note=why_not)
            return plan, plan_lib.StepPrograms(keras_step, window=window,
                                               concatenate=concatenate)
        compiled = packed_step.compiled_packed_step(model, self.strategy, state)
        plan = dataclasses.replace(plan, step="packed", rows=True)
        if group == 1:
            return plan, plan_lib.StepPrograms(keras_step, compiled,
                                               packed_step.splits_over_replicas, window=window)
        shardings = packed_step.output_shardings(self.strategy, state)
        sharded = self._sharded_update(model, layout, shardings)
        return (dataclasses.replace(plan, group_program=True, sharded_update=sharded is not None),
                plan_lib.StepPrograms(keras_step, compiled, packed_step.splits_over_replicas,
                                      *group_step.programs(compiled, shardings, sharded),
                                      window=window))

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


def _rows_of(keras_step: Callable[..., Any]) -> Callable[..., Any]:
    """``keras_step`` (jitted) taking ``RowBatch`` batches too, their rows gathered in it."""
    def train_step(state: Any, data: Any) -> Any:  # Keras' name, for jit's logs and profiles
        return keras_step(state, device_rows.whole_batch(data))

    return train_step
