"""Keras ``fit``/``evaluate``/``predict`` under ``ParameterServerStrategy``.

Keras' own loop (callbacks, History, validation, progress bar) runs on the chief; each group of
``steps_per_execution`` steps runs as one closure on a worker (``keras.steps.ps_steps``). Inputs:

- numpy arrays (and dicts/lists of them) with ``batch_size``: cut into global batches exactly as
  under every other strategy (``keras.feed``: shuffle from ``(seed, epoch)``, ``class_weight``,
  ``sample_weight``, ``validation_split``); the arrays reach each worker once per call as raw
  tensors and each closure names its batches by row indices (``worker_data``);
- ``sx.DatasetCreator(dataset_fn)`` (TensorFlow's ``DatasetCreator``): each worker builds its
  own data by calling ``dataset_fn(input_context)``; ``steps_per_epoch`` (``steps``) required.

Under ``mode="sync"`` every group runs on every worker (worker ``i`` takes part ``i`` of each
batch of arrays) and the train step averages the workers' gradients.

Keras variables stay ordinary variables on the chief; they are placed on the parameter servers
when a step is first built, and the trained values (and ``optimizer.iterations``) are copied
back at the end of ``fit`` and before every save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from stratax._src import seam
from stratax._src.keras import feed as feed_lib
from stratax._src.keras import shard_recipes
from stratax._src.keras.dataset_creator import DatasetCreator
from stratax._src.keras.feed_layout import FeedLayout
from stratax._src.keras.runners.runner import KerasRunner, steps_per_execution
from stratax._src.keras.steps import plan as plan_lib
from stratax._src.keras.steps.ps_steps import (
    BatchRef,
    GroupPipeline,
    check_additive_metrics,
    sparse_tables,
)
from stratax._src.parameter_server.inputs import worker_data
from stratax._src.parameter_server.shard_init import remote_recipe

logger = logging.getLogger(__name__)
_KINDS = {"fit": "train", "evaluate": "test", "predict": "predict"}
_ACCEPTED = (
    "numpy arrays (or dicts/lists of them) with batch_size, or "
    "sx.DatasetCreator(dataset_fn) with steps_per_epoch (fit) / steps (evaluate, predict), "
    "where dataset_fn(input_context) runs on each worker"
)


class _ArrayRows:
    """Batches of arrays the workers hold, as ``BatchRef``s (row indices), in ``GlobalFeed``'s
    order; ``peek`` gives the first real batch (to build the model)."""

    def __init__(self, data: Any, arrays: Any, rows: Any) -> None:
        self.data, self._arrays, self._rows = data, arrays, rows

    @property
    def num_batches(self) -> int:
        return len(self._rows)

    def batches(self, seed: int, epoch: int, skip: int) -> Iterator[BatchRef]:
        for (rows,) in self._rows.batches(seed, epoch, skip):
            yield BatchRef(self.data, rows)

    def peek(self) -> Any:
        (rows,) = next(self._rows.batches(0, 0, 0))
        return jax.tree.map(lambda a: a[rows], self._arrays)


class _WorkerBatches:
    """Endless ``BatchRef``s of a per-worker iterator; ``peek`` gives zeros of its batch shape."""

    num_batches = None

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator

    def batches(self, seed: int, epoch: int, skip: int) -> Iterator[BatchRef]:
        while True:
            yield BatchRef(self.iterator)

    def peek(self) -> Any:
        return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), self.iterator.element_spec)


class _PSFeed(feed_lib.GlobalFeed):
    """A feed of ``BatchRef``s (recognised when ``fit`` hands its validation feed to
    ``evaluate``)."""


@dataclasses.dataclass
class _Call:
    method: str
    steps: dict[str, int | None]  # kind -> planned steps per epoch
    data: list[Any]  # ArrayData shipped for this call, released at its end


class ParameterServerRunner(KerasRunner):
    """Keras calls of a model under ``ParameterServerStrategy`` (see the module docstring)."""

    def __init__(self, strategy: Any) -> None:
        super().__init__(strategy)
        self._calls: list[_Call] = []
        self._pipelines: dict[tuple[int, str], GroupPipeline] = {}

    # ------------------------------------------------------------------ runner interface
    @contextlib.contextmanager
    def placement_scope(self) -> Iterator[None]:
        """Large variables with a Keras built-in initializer are built by their parameter
        servers, never on the chief (``shard_recipes``), and a Keras variable made under
        ``scope()`` with TensorFlow's ``per_worker_variable=True`` becomes a per-worker variable
        of the strategy."""
        def observe(variable: Any, options: dict[str, Any]) -> None:
            if options.get("per_worker_variable"):
                self.strategy.mark_per_worker(variable)

        with seam.variables_built_elsewhere(shard_recipes.built_on_servers), \
                seam.keras_variable_options(observe):
            yield

    def prepare(self, method: str, arguments: dict[str, Any]) -> dict[str, Any]:
        call = _Call(method, {}, [])
        try:
            arguments = self._convert(method, arguments, call)
        except BaseException:
            self._release(call)
            raise
        self._calls.append(call)
        return arguments

    def batches(self, local_batches: Iterator[tuple[Any, bool]]) -> Iterator[Any]:
        for batch, _ in local_batches:
            yield batch

    def make_step(self, model: Any, kind: str,
                  step_fn: Callable[..., Any]) -> plan_lib.PlannedStep:
        if kind == "train" and not type(model).train_step.__module__.startswith("keras."):
            raise ValueError(
                f"{type(model).__name__} overrides train_step; under ParameterServerStrategy the "
                "optimizer runs on the parameter servers, so model.fit runs Keras' own train "
                "step. Write the step as a custom loop (ClusterCoordinator.schedule with "
                "strategy.run) instead."
            )
        if kind != "predict":
            check_additive_metrics(model)
        self.strategy.place_variables([*model.trainable_variables,
                                       *model.non_trainable_variables])
        optimizer = getattr(model, "optimizer", None)
        if kind == "train" and optimizer is not None and optimizer.built \
                and int(optimizer.iterations.numpy()) > 0:
            # A model whose optimizer state was loaded (load_model, a backup) trains on from
            # it: the variables the servers have never updated (placed by this step, or by an
            # evaluate or predict before it) get the Keras optimizer's slots and iterations.
            self.strategy.push_optimizer_state(optimizer, [
                v for v in model.trainable_variables
                if not any(self.strategy.optimizer_iterations(self.strategy.place_variables(v)))])
        workers = self._num_workers()
        pipeline = GroupPipeline(model, kind, self.strategy.cluster_coordinator(),
                                 depth=workers,
                                 planned_steps=lambda: self._planned_steps(kind))
        self._pipelines[(id(model), kind)] = pipeline
        return plan_lib.PlannedStep.fixed(
            plan_lib.StepPlan(kind, step="scheduled", over=f"{workers} worker(s)",
                              group=steps_per_execution(model), group_program=True),
            plan_lib.StepPrograms(whole=pipeline))

    def call(self, run: Callable[[], Any]) -> Any:
        method = self._calls[-1].method if self._calls else None
        if method is None:  # compile, *_on_batch: nothing scheduled by this runner
            return run()
        try:
            result = run()
        except BaseException:
            self._abandon()
            raise
        self.strategy.cluster_coordinator().join()
        if method == "fit" and len(self._calls) == 1:
            self._refresh_models()
        return result

    def finish(self) -> None:
        if self._calls:
            self._release(self._calls.pop())

    def before_save(self, model: Any) -> None:
        self.strategy.cluster_coordinator().flush_replicas()
        self.strategy.refresh_keras_variables()
        if (id(model), "train") in self._pipelines:
            _set_iterations(self.strategy, model)
            self.strategy.pull_optimizer_state(model.optimizer, model.trainable_variables)

    def after_restore(self, model: Any) -> None:
        self.strategy.cluster_coordinator().drop_replicas()
        self.strategy.push_optimizer_state(model.optimizer, model.trainable_variables)
        for variable in model.non_trainable_variables:
            if remote_recipe(variable) is None:
                self.strategy.place_variables(variable).assign(np.asarray(variable.numpy()))

    def save_held_elsewhere(self, model: Any, directory: str) -> dict[str, Any]:
        """The variables built by their servers (and their optimizer state) into a sharded
        checkpoint under ``directory``, written by the servers; the backup records its
        version."""
        remote = _built_on_servers(model)
        if not remote:
            return {}
        version = self.strategy.save_checkpoint_version(
            directory, self.strategy.place_variables(remote))
        return {"servers_version": version}

    def restore_held_elsewhere(self, model: Any, directory: str, meta: dict[str, Any]) -> None:
        remote = _built_on_servers(model)
        if not remote:
            return
        if "servers_version" not in meta:
            raise ValueError(
                f"The backup in {directory!r} holds no state of {[v.path for v in remote]}, "
                "which its parameter servers build: it was written for another model. Use "
                "another backup_dir, or delete this one to start over.")
        self.strategy.restore_checkpoint_version(
            directory, meta["servers_version"], self.strategy.place_variables(remote))

    def hold_after(self, model: Any, steps: int) -> None:
        pipeline = self._pipelines.get((id(model), "train"))
        if pipeline is not None:
            pipeline.hold_after(steps)

    # ------------------------------------------------------------------ internals
    def _convert(self, method: str, arguments: dict[str, Any], call: _Call) -> dict[str, Any]:
        x = arguments.get("x")
        kind = _KINDS[method]
        steps_name = "steps_per_epoch" if method == "fit" else "steps"
        if isinstance(x, _PSFeed):  # fit's validation feed, handed to evaluate
            call.steps[kind] = arguments.get(steps_name) or x.num_batches
            return arguments
        if isinstance(x, DatasetCreator):
            arguments = dict(arguments)
            arguments["x"] = self._creator_feed(x, method, arguments.get(steps_name), steps_name)
            if method == "fit":
                arguments["shuffle"] = False  # each worker's dataset_fn orders its own data
        elif feed_lib.is_array_input(x):
            layout = FeedLayout(self.strategy.num_replicas_in_sync)
            arguments = feed_lib.feed_arguments(method, arguments, layout)
            arguments["x"] = self._rows_feed(arguments["x"], call)
        else:
            raise TypeError(
                f"model.{method} under ParameterServerStrategy received x of type "
                f"{type(x).__name__}; it accepts {_ACCEPTED}. Build other inputs on the workers: "
                "wrap the code that makes the batches in a module-level "
                "dataset_fn(input_context) and pass sx.DatasetCreator(dataset_fn)."
            )
        call.steps[kind] = arguments.get(steps_name) or arguments["x"].num_batches
        if method == "fit":
            validation = arguments.get("validation_data")
            if isinstance(validation, DatasetCreator):
                validation = self._creator_feed(validation, "fit", arguments.get(
                    "validation_steps"), "validation_steps")
            elif isinstance(validation, feed_lib.GlobalFeed):
                validation = self._rows_feed(validation, call)
            elif validation is not None:
                raise TypeError(f"validation_data of type {type(validation).__name__} is not "
                                f"accepted under ParameterServerStrategy; use {_ACCEPTED}.")
            arguments["validation_data"] = validation
            if validation is not None:
                call.steps["test"] = arguments.get("validation_steps") or validation.num_batches
            callbacks = arguments.get("callbacks")
            for callback in callbacks if isinstance(callbacks, list) else ():
                if isinstance(callback, feed_lib.FeedEpochs):  # it shuffles the rows feed now
                    callback.feed = arguments["x"]
        return arguments

    def _rows_feed(self, feed: Any, call: _Call) -> _PSFeed:
        split = feed.array_split()
        if split is None:
            raise TypeError(f"Under ParameterServerStrategy the input must be {_ACCEPTED}.")
        arrays, rows = split
        data = worker_data.array_data(self.strategy.cluster_coordinator(), arrays)
        call.data.append(data)
        out = _PSFeed(_ArrayRows(data, arrays, rows), feed.layout, seed=feed.seed,
                      per_worker=True)
        out.prefetch = 0
        return out

    def _creator_feed(self, creator: DatasetCreator, method: str, steps: int | None,
                      steps_name: str) -> _PSFeed:
        if not steps:
            raise ValueError(
                f"model.{method} with a DatasetCreator needs `{steps_name}`: each worker's "
                f"dataset may be endless, so say how many steps make an epoch, e.g. "
                f"`model.{method}(sx.DatasetCreator(dataset_fn), ..., {steps_name}=100)`."
            )
        coordinator = self.strategy.cluster_coordinator()
        iterator = iter(coordinator.create_per_worker_dataset(creator.dataset_fn))
        out = _PSFeed(_WorkerBatches(iterator), FeedLayout(1), per_worker=True)
        out.prefetch = 0
        return out

    def _planned_steps(self, kind: str) -> int | None:
        for call in reversed(self._calls):
            if kind in call.steps:
                return call.steps[kind]
        return None

    def _num_workers(self) -> int:
        return len(self.strategy.cluster_resolver.cluster_spec().job_tasks("worker"))

    def _abandon(self) -> None:
        """After a failed or interrupted call: forget groups in flight, wait for them, and
        clear the coordinator's copy of the error already being raised."""
        for pipeline in self._pipelines.values():
            pipeline.discard()
        with contextlib.suppress(Exception):
            self.strategy.cluster_coordinator().join()

    def _release(self, call: _Call) -> None:
        coordinator = self.strategy.cluster_coordinator()
        for data in call.data:
            try:
                coordinator.release_data(data)
            except Exception as err:  # the call's own error matters more
                logger.info("could not release %s: %s", data.name, err)

    def _refresh_models(self) -> None:
        self.strategy.refresh_keras_variables()
        for (_, kind), pipeline in self._pipelines.items():
            if kind == "train":
                _set_iterations(self.strategy, pipeline.model)
                self.strategy.pull_optimizer_state(pipeline.model.optimizer,
                                                   pipeline.model.trainable_variables)


def _built_on_servers(model: Any) -> list[Any]:
    """The model's variables its parameter servers built (``shard_recipes``)."""
    return [v for v in model.variables if remote_recipe(v) is not None]


def _set_iterations(strategy: Any, model: Any) -> None:
    """``model.optimizer.iterations`` = the most updates any shard of the model's trained
    variables applied (the steps trained); shards that applied fewer are named in a warning
    with their counts (see ``shards_behind``)."""
    optimizer = getattr(model, "optimizer", None)
    variables = list(getattr(model, "trainable_variables", ()))
    if optimizer is None or not variables:
        return
    if getattr(strategy, "hybrid", None) is not None:
        # Hybrid mode: the replicated variables take one update per step; a table's shards
        # take one per worker per step when its updates are asynchronous.
        tables = {id(t) for t in sparse_tables(model)}
        variables = [v for v in variables if id(v) not in tables] or variables
    counts = {}
    for variable in strategy.place_variables(variables):  # placed already: by the train step
        for placement, count in zip(variable.placements,
                                    strategy.optimizer_iterations(variable), strict=True):
            counts[f"{placement.key!r} (ps {placement.ps})"] = count
    optimizer.iterations.assign(max(counts.values()))
    behind = shards_behind(counts)
    if behind:
        logger.warning(behind)


def shards_behind(counts: dict[str, int]) -> str | None:
    """Names the shards that applied fewer updates than the most any shard applied, with
    their counts, or ``None`` when all agree: a count in ``optimizer.iterations`` alone would
    hide them."""
    most = max(counts.values())
    fewer = {shard: count for shard, count in counts.items() if count < most}
    if not fewer:
        return None
    listed = ", ".join(f"{shard}: {count}" for shard, count in sorted(
        fewer.items(), key=lambda item: item[1])[:8])
    more = f" and {len(fewer) - 8} more" if len(fewer) > 8 else ""
    return (f"optimizer.iterations = {most}, the most updates a shard applied; {len(fewer)} "
            f"shard(s) applied fewer: {listed}{more}. A ps restored from its snapshot lost the "
            "updates after it, a restored checkpoint set its shards' counts, and row-sparse "
            "updates skip the shards whose rows a step did not read; "
            "strategy.optimizer_iterations(variable) gives each shard's count.")
