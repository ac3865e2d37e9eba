"""``Model.reset_metrics``: one compiled program of zeros, and no cross-process check.

Keras resets every metric at the start of each epoch (and of each ``evaluate``) by assigning
it its initial value. Done eagerly, each variable costs a small program (the constant), a copy
to the host and back (the placement), and between processes JAX's check that every process
passed the same value: one cross-process all-gather per metric variable, over gloo a
scheduler tick each on a pinned core, at every epoch boundary. Without the check, the eager
reset still costs CPU at every epoch start while the devices idle (docs/design/performance.md
has both costs).

So the variables of metrics whose reset is one of Keras' own zeroing ones (``Metric``'s,
``Mean``'s, ``Sum``'s: every metric built on them that does not override ``reset_state``, the
loss tracker and the compiled metrics' ``MeanMetricWrapper``s included) are set from one
jitted program that makes their zeros already placed as the variables are. Any other metric
runs its own ``reset_state``; a replicated host value it assigns is placed straight from this
process's copy (every process runs the same reset to the same constants, so JAX's check
proves nothing there); any other assignment keeps JAX's check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import NamedSharding

from stratax._src import seam


def _replicated_from_local(value: Any, sharding: Any) -> Any:
    """``value`` on ``sharding`` without a cross-process check, or ``None`` to let Keras place it.

    Only a host or uncommitted value (what JAX would check) going onto a fully replicated
    layout that spans other processes is placed here; anything else keeps Keras' way.
    """
    if not (isinstance(sharding, NamedSharding) and sharding.is_fully_replicated
            and not sharding.is_fully_addressable):
        return None
    if isinstance(value, jax.core.Tracer) or (isinstance(value, jax.Array) and value.committed):
        return None
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


# Keras' own zeroing resets (as Keras defines them, read once), and the variables each zeroes.
_ZEROING_RESETS: dict[Callable[..., Any], Callable[[Any], list[Any]]] = {
    keras.metrics.Metric.reset_state: lambda metric: list(metric.variables),
    keras.metrics.Mean.reset_state: lambda metric: [metric.total, metric.count],
    keras.metrics.Sum.reset_state: lambda metric: [metric.total],
}


def _zeroed_variables(metric: Any) -> list[Any] | None:
    """The variables ``metric.reset_state()`` sets to zeros, when it is one of Keras' own
    zeroing resets (``None`` for any other reset, which must run as written)."""
    zeroed = _ZEROING_RESETS.get(type(metric).reset_state)
    return None if zeroed is None else zeroed(metric)


@functools.lru_cache(maxsize=64)
def _zeros_program(layout: tuple[tuple[tuple[int, ...], Any, Any], ...]) -> Callable[[], Any]:
    """A jitted ``() -> zeros`` for ``layout``'s (shape, dtype, sharding) triples."""
    return jax.jit(lambda: tuple(jnp.zeros(shape, dtype) for shape, dtype, _ in layout),
                   out_shardings=tuple(sharding for _, _, sharding in layout))


def _committed_value(variable: Any) -> Any:
    value = variable.value
    return value if isinstance(value, jax.Array) and value.committed else None


def reset_metrics_method(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (Keras' ``Model.reset_metrics``), with zeroing resets in one program and
    replicated resets placed locally."""

    @functools.wraps(original)
    def reset_metrics(self: Any) -> Any:
        if _reset_fast(self):
            return None
        with seam.variable_placement(_replicated_from_local):
            return original(self)

    return reset_metrics


def _reset_fast(model: Any) -> bool:
    """Resets ``model``'s metrics as Keras' ``reset_metrics`` does, zeroing resets in one
    program; ``False`` (nothing reset yet) when a zeroed variable holds no placed array (a
    tracer, an uncommitted value), which Keras' own reset then handles."""
    zeroed, others = [], []
    for metric in model.metrics:
        variables = _zeroed_variables(metric)
        if variables is None:
            others.append(metric)
        else:
            zeroed.extend(variables)
    values = [_committed_value(v) for v in zeroed]
    if any(value is None for value in values):
        return False
    if zeroed:
        layout = tuple((value.shape, value.dtype, value.sharding) for value in values)
        for variable, zeros in zip(zeroed, _zeros_program(layout)(), strict=True):
            variable.assign(zeros)
    with seam.variable_placement(_replicated_from_local):
        for metric in others:
            metric.reset_state()
    return True
