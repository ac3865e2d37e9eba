"""A group of ``steps_per_execution`` packed train steps as one compiled program.

Keras' JAX trainer runs a group of ``steps_per_execution`` steps as a Python loop, one host
dispatch per step. Between processes pinned one core each, that host work shares the core
with the step, and it does not shrink when the batch is split over more processes while the
compute does. Here the group's placed batches go to one jitted program that runs the step on
each in turn (unrolled: ``lax.scan`` over stacked batches was slower, because stacking copies
the batches once more): one dispatch per group. ``benchmarks.step_profile``, 2 processes x 1
core, MLP, quiet box: 1.09 ms per step against 1.23 ms with Keras' loop (median of 3
interleaved runs). One process gains nothing from it (1.57 against 1.51 ms), so only the
packed multi-replica step uses it.

The steps and their order are the Python loop's; a group that cannot run as one (fewer batches
left in the epoch, or batches of another shape or placement, e.g. the last, partial one) runs
step by step, as Keras would run it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax

Step = Callable[[Any, Any], tuple[Any, Any]]


def _signature(batch: Any) -> tuple[Any, ...]:
    leaves, structure = jax.tree.flatten(batch)
    return structure, tuple((getattr(leaf, "shape", None), getattr(leaf, "dtype", None),
                             getattr(leaf, "sharding", None)) for leaf in leaves)


def grouped_steps(size: int, traced_step: Step, single_step: Step,
                  groupable: Callable[[Any], bool],
                  out_shardings: Any = None) -> Callable[[Any, Iterator[Any]], Any]:
    """Keras' ``iterator_step(state, iterator) -> (logs, state)`` for groups of ``size`` steps.

    Args:
        size: the model's ``steps_per_execution``.
        traced_step: the step as a traceable ``(state, batch) -> (logs, state)``.
        single_step: the step as it runs alone (for groups that cannot run as one program).
        groupable: whether a batch may run in the group program (e.g. it is split over the
            replicas the way ``traced_step`` expects).
        out_shardings: the group program's ``(logs, state)`` output shardings (``None``: jit's
            choice), so its state comes back placed as it went in.
    """

    def steps(state: Any, batches: list[Any]) -> tuple[Any, Any]:
        logs = None
        for batch in batches:
            logs, state = traced_step(state, batch)
        return logs, state

    program = jax.jit(steps, donate_argnums=0, out_shardings=out_shardings)

    def iterator_step(state: Any, iterator: Iterator[Any]) -> tuple[Any, Any]:
        batches = [next(iterator)]  # StopIteration here ends the epoch, as in Keras' loop
        for _ in range(size - 1):
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
        first = _signature(batches[0])
        if len(batches) == size and all(
                groupable(batch) and _signature(batch) == first for batch in batches):
            return program(state, batches)
        logs = None
        for batch in batches:
            logs, state = single_step(state, batch)
        return logs, state

    return iterator_step
