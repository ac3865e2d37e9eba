"""A group of ``steps_per_execution`` train steps as one compiled program.

Keras' JAX trainer runs a group of ``steps_per_execution`` steps as a Python loop, one host
dispatch per step. Between processes pinned one core each, that host work shares the core
with the step, and it does not shrink when the batch is split over more processes while the
compute does. Here the group runs as one jitted program: one dispatch per group.

Batches of array input kept on the devices (``device_rows.RowBatch``es over the same placed
arrays and row order, the common case) run as a ``lax.scan`` over the batches' starts, each
step gathering its rows right before it uses them. Unrolled, XLA hoists all the group's
gathers to the front, so every gathered batch of the group lives at once in a large scratch
buffer whose fresh pages stall one process now and then (and, through the all-reduce, the
other), and the batches are read back from memory rather than from cache. The arrays and the
order are passed once, so each dispatch carries fewer arguments. One process gains too, so the
one-device step uses the scan as well.

Other placed batches (cut on the host) run unrolled, for the packed multi-replica step only
(``lax.scan`` would need them stacked, one more copy of each); one process gains nothing from
that, so it keeps Keras' loop. The measurements behind both choices, with the commands that
reproduce them: ``docs/design/performance.md``, "Numbers behind the code's choices".

The steps and their order are the Python loop's; a group that cannot run as one (fewer batches
left in the epoch, or batches of another shape or placement, e.g. the last, partial one) runs
step by step, as Keras would run it. A batch that cannot be read (its input raised) ends the
group as Keras' loop would: the batches read before it are trained, step by step, each state
noted in the running call (``call_stack.record_state``), then the input's error is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from stratax._src.keras import call_stack
from stratax._src.keras.steps import device_rows

Step = Callable[[Any, Any], tuple[Any, Any]]


def _signature(batch: Any) -> tuple[Any, ...]:
    leaves, structure = jax.tree.flatten(batch)
    return structure, tuple((getattr(leaf, "shape", None), getattr(leaf, "dtype", None),
                             getattr(leaf, "sharding", None)) for leaf in leaves)


def grouped_steps(size: int, traced_step: Step, single_step: Step,
                  groupable: Callable[[Any], bool], out_shardings: Any = None,
                  row_program: Step | None = None) -> Callable[[Any, Iterator[Any]], Any]:
    """Keras' ``iterator_step(state, iterator) -> (logs, state)`` for groups of ``size`` steps.

    Args:
        size: the model's ``steps_per_execution``.
        traced_step: the step as a traceable ``(state, batch) -> (logs, state)``.
        single_step: the step as it runs alone (for groups that cannot run as one program).
        groupable: whether a batch may run in the group program (e.g. it is split over the
            replicas the way ``traced_step`` expects).
        out_shardings: the group program's ``(logs, state)`` output shardings (``None``: jit's
            choice), so its state comes back placed as it went in.
        row_program: the program for a ``device_rows.RowGroup`` (``None``: ``traced_step``
            scanned over its batches), e.g. ``keras.steps.sharded_update``'s.
    """

    def steps(state: Any, batches: list[Any]) -> tuple[Any, Any]:
        logs = None
        for batch in batches:
            logs, state = traced_step(state, batch)
        return logs, state

    program = jax.jit(steps, donate_argnums=0, out_shardings=out_shardings)

    def row_steps(state: Any, rows: device_rows.RowGroup) -> tuple[Any, Any]:
        def step(state: Any, start: Any) -> tuple[Any, Any]:
            logs, state = traced_step(state, rows.batch(start))
            return state, logs

        state, logs = jax.lax.scan(step, state, jnp.stack(rows.starts))
        return jax.tree.map(lambda stacked: stacked[-1], logs), state

    if row_program is None:
        row_program = jax.jit(row_steps, donate_argnums=0, out_shardings=out_shardings)

    def one_by_one(state: Any, batches: list[Any]) -> tuple[Any, Any]:
        logs = None
        for batch in batches:
            logs, state = single_step(state, batch)
            call_stack.record_state(state)
        return logs, state

    def iterator_step(state: Any, iterator: Iterator[Any]) -> tuple[Any, Any]:
        batches = [next(iterator)]  # StopIteration here ends the epoch, as in Keras' loop
        for _ in range(size - 1):
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
            except Exception:
                one_by_one(state, batches)  # Keras' loop trained them before this read
                raise
        if len(batches) == size:
            rows = device_rows.RowGroup.of(batches)
            if rows is not None and groupable(batches[0]):
                return row_program(state, rows)
        first = _signature(batches[0])
        if len(batches) == size and all(
                groupable(batch) and _signature(batch) == first for batch in batches):
            return program(state, batches)
        return one_by_one(state, batches)

    return iterator_step
