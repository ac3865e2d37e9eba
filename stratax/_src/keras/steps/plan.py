"""The step plan: how each group of ``steps_per_execution`` steps of a call runs, chosen once.

Keras' loop calls a model's step function once per group of batches,
``iterator_step(state, iterator) -> (logs, state)``. Under a strategy that function is a
:class:`PlannedStep`. On its first call the strategy's runner chooses one :class:`StepPlan` (which
step, grouped or not, bounded or not, ...) and the :class:`StepPrograms` that carry it out (the
jitted programs); from then on every call executes that plan here, in one place, in this order:

1. note the state the group starts from in the running call (``call_stack.record_state``: what a
   call that fails leaves the model, ``keras.failed_calls``);
2. commit the state to the strategy's one device (one-device plans: jit's cache key includes
   whether an argument is committed, so this keeps every call on one compiled program);
3. run the group, one of three ways:

   - the runner's own group function (``whole``: the TPU's on-device loop, the parameter
     servers' scheduled closures);
   - a group program (``group_program``): a full group of batches the runner's own step takes
     runs as one jitted program (a scan over rows kept on the devices, else unrolled; see
     ``keras.steps.group_step``); any other group (a short last one, a batch of another shape)
     runs step by step, each state noted;
   - Keras' loop: up to ``steps_per_execution`` steps one after the other, each state noted
     and each result admitted to the strategy's dispatch window (bounded plans);

   each single step being the runner's own jitted step (``own_step``) for the batches it takes
   (split over the replicas, rows kept on the devices), else Keras' own;
4. note the state it returns, and mark a train step's logs as the results of the metric values
   in that state (``keras.steps.epoch_logs``, plans with ``state_logs``).

So a step of ``fit`` is never more than two calls deep: this object, then a jitted program. The
plan is logged once, at DEBUG, by its :meth:`StepPlan.describe`; docs/design/step-plan.md has the
plans of each strategy and the whole path of a batch.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import keras

from stratax._src.keras import call_stack
from stratax._src.keras.steps import device_rows, epoch_logs

logger = logging.getLogger(__name__)

Step = Callable[[Any, Any], tuple[Any, Any]]


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one model's ``fit``/``evaluate``/``predict`` steps run under a strategy.

    Attributes:
        kind: ``"train"``, ``"test"`` or ``"predict"``.
        step: ``"keras"`` (Keras' own step), ``"packed"`` (one packed all-reduce of the
            gradients and metric updates, ``keras.steps.packed_step``), ``"tpu-loop"`` (the TPU
            runner's on-device loop) or ``"scheduled"`` (closures on parameter-server workers).
        over: where the step runs, in words (``"cpu:0"``, ``"2 replicas"``, ...).
        group: the model's ``steps_per_execution``.
        group_program: a full group runs as one jitted program, not Keras' loop.
        rows: the step takes batches named by rows of arrays kept on the devices.
        sharded_update: the group program shards the optimizer update over the processes.
        committed: the state is committed to the strategy's one device before each group.
        window: steps (or group programs) in flight at most, 0 for no bound.
        state_logs: the train logs are marked as the results of the returned metric values.
        note: why the plan is not a faster one (e.g. why the step is not packed), or ``""``.
    """

    kind: str
    step: str = "keras"
    over: str = ""
    group: int = 1
    group_program: bool = False
    rows: bool = False
    sharded_update: bool = False
    committed: bool = False
    window: int = 0
    state_logs: bool = False
    note: str = ""

    @property
    def name(self) -> str:
        """A short name, e.g. ``"train/packed+group4+rows"``."""
        parts = [self.step]
        if self.group > 1:
            parts.append(f"group{self.group}" if self.group_program else f"loop{self.group}")
        parts += [label for label, on in (("rows", self.rows),
                                          ("sharded-update", self.sharded_update)) if on]
        return f"{self.kind}/{'+'.join(parts)}"

    def describe(self) -> str:
        """The plan in one sentence per part, for logs and docs."""
        steps = {
            "keras": f"Keras' own {self.kind} step",
            "packed": "the packed train step (gradients and metric updates all-reduced in one "
                      "packed collective)",
            "tpu-loop": f"the TPU {self.kind} step in an on-device loop of static shapes",
            "scheduled": f"Keras' {self.kind} step scheduled on the workers, one closure a group",
        }
        text = [f"{self.name}: {steps.get(self.step, self.step)}"
                + (f" over {self.over}" if self.over else "")
                + (f" (not packed: {self.note})" if self.note else "") + "."]
        if self.rows:
            text.append("Array input kept on the devices is read by rows inside the step.")
        if self.group > 1:
            text.append(self._group_sentence())
        if self.sharded_update:
            text.append("The optimizer update is sharded over the processes (a reduce-scatter "
                        "and an all-gather).")
        if self.committed:
            text.append("The state is committed to the device.")
        if self.window:
            text.append(f"At most {self.window} dispatched ahead.")
        if self.state_logs:
            text.append("The epoch's logs are the last step's.")
        return " ".join(text)

    def _group_sentence(self) -> str:
        if self.step == "tpu-loop":
            return (f"Each group of up to {self.group} steps is one on-device loop, a short one "
                    "padded with skipped steps.")
        if self.step == "scheduled":
            return f"Each group of up to {self.group} steps is one closure on a worker."
        if self.group_program:
            return (f"A full group of {self.group} steps runs as one program; other groups step "
                    "by step.")
        return f"Up to {self.group} steps per call, one after the other."


@dataclasses.dataclass(frozen=True)
class StepPrograms:
    """What a :class:`StepPlan` runs (built by the runner that chose it).

    Attributes:
        keras_step: Keras' single step ``(state, batch) -> (logs, state)``.
        own_step: the runner's own single step, for the batches ``takes_own`` accepts.
        takes_own: whether a batch runs in ``own_step`` and in the group programs.
        group: the group program over a list of batches (``group_step.programs``).
        row_group: the group program over a ``device_rows.RowGroup``.
        whole: the runner's own ``iterator_step`` for a whole group, instead of all of the above.
        window: the strategy's ``DispatchWindow`` (bounded plans).
        device: the device the state is committed to (``StepPlan.committed``).
        concatenate: joins the outputs of a group of predict steps, as Keras' loop does.
    """

    keras_step: Step | None = None
    own_step: Step | None = None
    takes_own: Callable[[Any], bool] | None = None
    group: Step | None = None
    row_group: Step | None = None
    whole: Callable[[Any, Iterator[Any]], tuple[Any, Any]] | None = None
    window: Any = None
    device: Any = None
    concatenate: Callable[[list[Any]], Any] | None = None


Choose = Callable[[Any, Callable[[], Any]], tuple[StepPlan, StepPrograms]]


class PlannedStep:
    """Keras' ``iterator_step(state, iterator) -> (logs, state)`` executing one plan.

    Args:
        choose: ``(state, first_batch) -> (plan, programs)``, called on the first call with
            its state; ``first_batch()`` reads the first batch (handed back to the plan with the
            rest of the iterator), for plans that depend on it.
    """

    def __init__(self, choose: Choose) -> None:
        self._choose = choose
        self.plan: StepPlan | None = None
        self._programs = StepPrograms()
        self._returned: Any = None  # the state the last group returned (committed plans)

    @classmethod
    def fixed(cls, plan: StepPlan, programs: StepPrograms) -> PlannedStep:
        """A planned step whose plan is known before any batch."""
        return cls(lambda state, first_batch: (plan, programs))

    def __call__(self, state: Any, iterator: Iterator[Any]) -> tuple[Any, Any]:
        if self.plan is None:
            iterator = self._choose_plan(state, iterator)
        plan, programs = self.plan, self._programs
        call_stack.record_state(state)
        if programs.device is not None and state is not self._returned:
            state = _placed_on(state, programs.device)
        if programs.whole is not None:
            logs, state = programs.whole(state, iterator)
        elif plan.group_program:
            logs, state = self._group(state, iterator)
            if programs.window is not None:
                programs.window.admit(logs)
        else:
            logs, state = self._loop(state, iterator)
        self._returned = state
        call_stack.record_state(state)
        if plan.state_logs and isinstance(logs, dict):
            logs = epoch_logs.StateLogs(logs, state[3])
        return logs, state

    def _choose_plan(self, state: Any, iterator: Iterator[Any]) -> Iterator[Any]:
        read: list[Any] = []

        def first_batch() -> Any:
            if not read:
                read.append(next(iterator))  # StopIteration ends the epoch, as in Keras' loop
            return read[0]

        self.plan, self._programs = self._choose(state, first_batch)
        logger.debug("step plan %s", self.plan.describe())
        return itertools.chain(read, iterator) if read else iterator

    def _step_for(self, data: Any) -> Step:
        """The single step that runs ``data``: the runner's own where it takes it, else Keras'."""
        programs = self._programs
        if programs.own_step is not None and programs.takes_own(data):
            return programs.own_step
        return programs.keras_step

    def _loop(self, state: Any, iterator: Iterator[Any]) -> tuple[Any, Any]:
        """Keras' loop over a group: up to ``plan.group`` steps, each state noted."""
        window = self._programs.window
        outputs = []
        for index in range(self.plan.group):
            if index == 0:
                data = next(iterator)  # StopIteration here ends the epoch, as in Keras' loop
            else:
                try:
                    data = next(iterator)
                except StopIteration:
                    break
            logs, state = self._step_for(data)(state, data)
            if window is not None:
                window.admit(logs)
            call_stack.record_state(state)
            outputs.append(logs)
        concatenate = self._programs.concatenate
        return (concatenate(outputs) if concatenate is not None else outputs[-1]), state

    def _group(self, state: Any, iterator: Iterator[Any]) -> tuple[Any, Any]:
        """A group as one program where its batches allow (the module docstring), else step by
        step; a batch that cannot be read ends the group as Keras' loop would: the batches read
        before it are trained, then the input's error is raised."""
        size, programs = self.plan.group, self._programs
        batches = [next(iterator)]  # StopIteration here ends the epoch, as in Keras' loop
        for _ in range(size - 1):
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
            except Exception:
                self._one_by_one(state, batches)  # Keras' loop trained them before this read
                raise
        if len(batches) == size and programs.takes_own(batches[0]):
            rows = device_rows.RowGroup.of(batches)
            if rows is not None:
                return programs.row_group(state, rows)
            first = _signature(batches[0])
            if all(programs.takes_own(batch) and _signature(batch) == first
                   for batch in batches):
                return programs.group(state, batches)
        return self._one_by_one(state, batches)

    def _one_by_one(self, state: Any, batches: list[Any]) -> tuple[Any, Any]:
        logs = None
        for batch in batches:
            logs, state = self._step_for(batch)(state, batch)
            call_stack.record_state(state)
        return logs, state


def concatenation(jitted: bool) -> Callable[[list[Any]], Any]:
    """Keras' join of a group's predict outputs (jitted as Keras jits it, for jitted models)."""

    def concatenate(outputs: list[Any]) -> Any:
        output = outputs[0]
        for next_output in outputs[1:]:
            output = keras.tree.map_structure(
                lambda t1, t2: jnp.concatenate([t1, t2]), output, next_output)
        return output

    return jax.jit(concatenate) if jitted else concatenate


def is_row_batch(data: Any) -> bool:
    """Whether ``data`` is a ``device_rows.RowBatch`` (what a one-device row step takes)."""
    return isinstance(data, device_rows.RowBatch)


def _signature(batch: Any) -> tuple[Any, ...]:
    leaves, structure = jax.tree.flatten(batch)
    return structure, tuple((getattr(leaf, "shape", None), getattr(leaf, "dtype", None),
                             getattr(leaf, "sharding", None)) for leaf in leaves)


def _placed_on(tree: Any, device: Any) -> Any:
    """``tree`` with every leaf not already committed to ``device`` placed there (one batch).

    Keras hands over fresh, uncommitted state at the start of a call and after
    ``reset_metrics``; a state the step returned is already committed and passes through
    untouched, and so do the leaves of a new state tuple that are (Keras rebuilds the tuple
    every epoch from its variables, which hold the step's outputs: re-placing all of them cost
    host time at every epoch).
    """
    sharding = jax.sharding.SingleDeviceSharding(device)
    leaves, structure = jax.tree.flatten(tree)
    stale = [i for i, leaf in enumerate(leaves)
             if not (isinstance(leaf, jax.Array) and leaf.committed and leaf.sharding == sharding)]
    if not stale:
        return tree
    for i, placed in zip(stale, jax.device_put([leaves[i] for i in stale], device), strict=True):
        leaves[i] = placed
    return jax.tree.unflatten(structure, leaves)
