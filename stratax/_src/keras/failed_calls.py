"""What a failed ``fit``/``evaluate``/``predict`` leaves: the model as its last completed step.

Keras' JAX trainer moves the model's variables into a state tuple for the length of a call:
it empties the variables (``purge_model_variables``), passes the state from step to step,
each step donating its input buffers, and puts the state back at the end. On a failure (a
callback's exception, a batch of the wrong shape, ``KeyboardInterrupt``) ``fit`` puts back the
state of its last *group* of steps, while ``evaluate`` and ``predict`` put back nothing: the
variables stay empty, and every later call fails with ``TypeError: 'NoneType' object is not
callable`` (Keras 3.15, plain Keras too). With ``steps_per_execution > 1`` a failure inside a
group loses even more: the group's first step donated the state ``fit`` puts back, so the
variables then hold deleted arrays.

Under a strategy every step loop notes the newest state it holds (``call_stack.record_state``:
the state a group of steps starts from, and each state a step returns), so a failed call leaves
the model exactly as its last completed step left it, as ``fit`` with one step per group does
in plain Keras: the batches trained before the failure count, the failing one does not.
"""

from __future__ import annotations

import logging
from typing import Any

import jax

from stratax._src import seam

logger = logging.getLogger(__name__)


def state_variables(model: Any, kind: str) -> list[list[Any]]:
    """The variables of each part of Keras' step state of ``kind`` (``"train"``, ``"test"`` or
    ``"predict"``), in the order of the state tuple."""
    parts = [model.trainable_variables, model.non_trainable_variables]
    if kind == "train":
        optimizer = getattr(model, "optimizer", None)
        parts.append(optimizer.variables if optimizer is not None else [])
    if kind in ("train", "test"):
        parts.append(model.metrics_variables)
    return parts


def _usable(value: Any) -> bool:
    return value is not None and not (isinstance(value, jax.Array) and value.is_deleted())


def restore_last_step(model: Any, kind: str, state: Any) -> None:
    """Gives ``model``'s variables the values of ``state``, the newest step state of a call of
    ``kind`` that failed (``None``: no step ran, nothing was taken from the variables).

    A value the failure deleted (donated to a step that then failed) leaves the variable as
    Keras left it. Never raises for a variable it cannot restore (the call's own error is the
    one to see); it logs those instead.
    """
    if state is not None:
        lost = []
        for variables, values in zip(state_variables(model, kind), state, strict=False):
            for variable, value in zip(variables, values, strict=False):
                if _usable(value) and _assigned(variable, value):
                    continue
                if not _usable(seam.held_value(variable)):
                    lost.append(variable.path)
        if lost:
            logger.error("A failed %s call lost the values of %s; rebuild or reload the model "
                         "(e.g. `model.load_weights(path)`).", kind, ", ".join(lost))
    seam.drop_pending_state(model)


def _assigned(variable: Any, value: Any) -> bool:
    """Assigns ``value`` to ``variable``; ``False`` where that fails (e.g. the value's own
    computation failed with the call), so the call's error stays the one raised."""
    try:
        variable.assign(value)
    except Exception:  # reported by the caller; never raised over the call's error
        logger.debug("Could not restore %s after a failed call", variable.path, exc_info=True)
        return False
    return True
