"""``KerasRunner``: the one interface through which a strategy plugs into Keras' ``fit``.

Keras' JAX trainer keeps its loop — epochs, callbacks, validation, history, progress bar — and a
strategy changes only what its runner says. Follow a batch from ``model.fit`` to the devices:

1. ``keras.methods`` receives ``model.fit(...)`` for a model bound to a strategy and asks the
   strategy's runner to :meth:`~KerasRunner.prepare` the arguments: the user's input becomes a
   :class:`~stratax._src.keras.feed.GlobalFeed`, the one batch path of every input kind (global
   batches, this process's share, the last partial batch, shuffling, class weights).
2. Keras builds its epoch iterator over the feed; each epoch it asks for an iterator, which the
   runner gives as :meth:`~KerasRunner.feed_batches`: the feed's batches placed on the replicas
   (or, for arrays kept on the devices, named by their rows: ``keras.steps.device_rows``).
3. Keras compiles ``train_step`` and asks how a group of ``steps_per_execution`` steps runs;
   :meth:`~KerasRunner.make_step` answers with a ``PlannedStep`` (``keras.steps.plan``) whose one
   plan the runner chooses on the first batch (the mirrored runner: packed, grouped, bounded; a
   TPU runner: an on-device loop; a parameter-server runner: the group scheduled on a worker).
4. Saves and ``get_weights`` first call :meth:`~KerasRunner.before_save`; a backup restored
   inside ``fit`` calls :meth:`~KerasRunner.after_restore`, and
   :meth:`~KerasRunner.hold_after` keeps steps that run ahead of the callbacks from passing
   the step a backup reads.

A runner is registered per strategy class with :func:`register_runner`; adding a strategy adds
one runner and touches no other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from stratax._src.keras import feed as feed_lib
from stratax._src.keras.feed_layout import FeedLayout
from stratax._src.keras.steps.plan import PlannedStep, StepPlan, StepPrograms, concatenation


class KerasRunner:
    """How one strategy runs Keras' ``fit``/``evaluate``/``predict`` (see the module docstring).

    Subclasses override the parts their strategy does differently; this base class runs Keras'
    own single-device behaviour.
    """

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def placement_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Where Keras creates variables and runs computations (``scope()`` and each call)."""
        return contextlib.nullcontext()

    def prepare(self, method: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Checks and rewrites the bound arguments of ``fit``/``evaluate``/``predict``."""
        return feed_lib.feed_arguments(method, arguments, self.feed_layout(method))

    def feed_layout(self, method: str) -> FeedLayout:
        """How the global batches of ``method`` are shared among processes and replicas."""
        return FeedLayout(
            num_replicas=self.strategy.num_replicas_in_sync,
            process_rank=self.strategy.process_rank,
            num_processes=self.strategy.num_processes,
            replicate_all=method == "predict" and self.strategy.is_multi_process,
            processes_per_replica=getattr(self.strategy, "processes_per_replica", 1),
        )

    def batches(self, local_batches: Iterator[tuple[Any, bool]]) -> Iterator[Any]:
        """Places one epoch of ``(local batch, replicated)`` pairs where the step reads them."""
        raise NotImplementedError  # pragma: no cover - every registered runner implements it

    def feed_batches(self, feed: feed_lib.GlobalFeed, call: Any) -> Iterator[Any]:
        """One pass of ``feed`` for ``call`` (``call_stack.Call``), placed: :meth:`batches` of the
        feed's local batches, unless the runner serves the feed another way."""
        return self.batches(feed.local_batches())

    def default_prefetch(self) -> int:
        """Batches ``fit`` places ahead of the step when nothing says otherwise.

        2 on accelerators, where the transfer overlaps the step; 0 on CPU, where the placing
        thread takes the cores the step needs (measured: docs/design/performance.md, "Numbers
        behind the code's choices").
        """
        devices = getattr(self.strategy, "devices", ())
        return 2 if any(d.platform != "cpu" for d in devices) else 0

    def place_unconverted(self, batches: Iterator[Any]) -> Iterator[Any]:
        """Places batches of an input kind stratax leaves to Keras (e.g. a ``tf.data`` dataset)."""
        return batches

    def make_step(self, model: Any, kind: str, step_fn: Callable[..., Any]) -> PlannedStep:
        """Returns the step function Keras calls once per group of ``steps_per_execution``
        batches, ``iterator_step(state, iterator) -> (logs, state)``: a
        :class:`~stratax._src.keras.steps.plan.PlannedStep` executing the plan this runner
        chooses (on its first call).

        ``kind`` is ``"train"``, ``"test"`` or ``"predict"``; ``step_fn(state, batch)`` is
        Keras' (compiled) single step of ``model``. This base class plans Keras' own loop.
        """
        group = steps_per_execution(model)
        jitted = model.jit_compile and not model.run_eagerly
        return PlannedStep.fixed(
            StepPlan(kind, group=group),
            StepPrograms(step_fn, concatenate=concatenation(jitted)
                         if kind == "predict" and group > 1 else None))

    def call(self, run: Callable[[], Any]) -> Any:
        """Runs Keras' method (lets a runner translate the failures of its transport)."""
        return run()

    def finish(self) -> None:
        """Called when a ``fit``/``evaluate``/``predict`` call ends, normally or not."""

    def before_save(self, model: Any) -> None:
        """Makes ``model``'s variables current before they are read for a save."""

    def after_restore(self, model: Any) -> None:
        """Makes the values just assigned to ``model``'s variables (a backup restored inside
        ``fit``) the ones its steps train on."""

    def save_held_elsewhere(self, model: Any, directory: str) -> dict[str, Any]:
        """Saves the part of ``model``'s state no process holds whole (none under this
        strategy) into ``directory``, beside a backup; returns what the backup's metadata
        records to restore exactly that version (``restore_held_elsewhere``)."""
        del model, directory
        return {}

    def restore_held_elsewhere(self, model: Any, directory: str, meta: dict[str, Any]) -> None:
        """Restores what ``save_held_elsewhere`` saved for the backup whose metadata is
        ``meta`` (after ``after_restore``)."""
        del model, directory, meta

    def hold_after(self, model: Any, steps: int) -> None:
        """Runs no training step of ``model`` more than ``steps`` steps past the last one whose
        callbacks ran, until they have: the state read there (a backup) is exactly theirs."""


def steps_per_execution(model: Any) -> int:
    """How many steps ``model`` runs per call of its step function (at least 1)."""
    return max(int(getattr(model, "steps_per_execution", 1) or 1), 1)


_RUNNERS: list[tuple[type, type[KerasRunner]]] = []
_RUNNER_ATTR = "_stratax_keras_runner"  # the strategy's runner, kept on the strategy object


def register_runner(strategy_class: type, runner_class: type[KerasRunner]) -> None:
    """Makes ``runner_class`` run Keras for ``strategy_class`` and its subclasses.

    The most specific registration wins, so a subclass strategy can bring its own runner.
    """
    _RUNNERS.insert(0, (strategy_class, runner_class))


def use_runner(strategy: Any, runner: KerasRunner) -> None:
    """Makes ``runner`` run Keras for this one ``strategy`` object (e.g. to compare runners)."""
    setattr(strategy, _RUNNER_ATTR, runner)


def runner_for(strategy: Any) -> KerasRunner:
    """The runner of ``strategy`` (one per strategy object, created on first use).

    Raises:
        TypeError: no runner is registered for the strategy's class.
    """
    cached = vars(strategy).get(_RUNNER_ATTR)
    if cached is not None:
        return cached
    candidates = [(cls, runner) for cls, runner in _RUNNERS if isinstance(strategy, cls)]
    if not candidates:
        raise TypeError(
            f"{type(strategy).__name__} has no Keras runner; register one with "
            "`stratax._src.keras.runners.runner.register_runner(StrategyClass, RunnerClass)`."
        )
    best = min(candidates, key=lambda pair: type(strategy).__mro__.index(pair[0]))[1]
    runner = best(strategy)
    setattr(strategy, _RUNNER_ATTR, runner)
    return runner
