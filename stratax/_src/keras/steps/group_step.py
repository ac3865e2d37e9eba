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

The steps and their order are the Python loop's. Which group runs in which program, and a group
that cannot run as one (fewer batches left in the epoch, or batches of another shape or
placement, e.g. the last, partial one), is the step plan's to decide (``keras.steps.plan``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from stratax._src.keras.steps import device_rows

Step = Callable[[Any, Any], tuple[Any, Any]]


def programs(traced_step: Step, out_shardings: Any = None,
             row_program: Step | None = None) -> tuple[Step, Step]:
    """The two group programs of ``traced_step``: ``(group, row_group)``.

    ``group(state, batches)`` runs the list ``batches`` unrolled; ``row_group(state, rows)`` a
    ``device_rows.RowGroup`` as a scan over its starts (or ``row_program`` where given, e.g.
    ``keras.steps.sharded_update``'s). Both donate ``state`` and return ``(logs, state)``, the
    logs of the last step.

    Args:
        traced_step: the step as a traceable ``(state, batch) -> (logs, state)``.
        out_shardings: the programs' ``(logs, state)`` output shardings (``None``: jit's
            choice), so their state comes back placed as it went in.
        row_program: the program for a ``RowGroup``, instead of the scan of ``traced_step``.
    """

    def steps(state: Any, batches: list[Any]) -> tuple[Any, Any]:
        logs = None
        for batch in batches:
            logs, state = traced_step(state, batch)
        return logs, state

    def row_steps(state: Any, rows: device_rows.RowGroup) -> tuple[Any, Any]:
        def step(state: Any, start: Any) -> tuple[Any, Any]:
            logs, state = traced_step(state, rows.batch(start))
            return state, logs

        state, logs = jax.lax.scan(step, state, jnp.stack(rows.starts))
        return jax.tree.map(lambda stacked: stacked[-1], logs), state

    if row_program is None:
        row_program = jax.jit(row_steps, donate_argnums=0, out_shardings=out_shardings)
    return jax.jit(steps, donate_argnums=0, out_shardings=out_shardings), row_program
