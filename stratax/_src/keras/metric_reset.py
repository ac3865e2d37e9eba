"""``Model.reset_metrics`` of a model whose metrics are mirrored over several processes.

Keras resets every metric at the start of each epoch (and of each ``evaluate``) by assigning
it its initial value, a host constant. Placing a host value on a layout that spans several
processes makes JAX check that every process passed the same value: one cross-process
all-gather per metric variable, over gloo a scheduler tick (~4 ms) each on a pinned core, so
the loss tracker and one metric cost ~16 ms at every epoch boundary of a 2-process ``fit``
(``benchmarks/README.md``). The check proves nothing here: every process runs the same reset
to the same constants. So the reset places each replicated value straight from this process's
copy, with no cross-process traffic; any other assignment keeps JAX's check.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
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


def reset_metrics_method(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (Keras' ``Model.reset_metrics``), placing replicated resets locally."""

    @functools.wraps(original)
    def reset_metrics(self: Any) -> Any:
        with seam.variable_placement(_replicated_from_local):
            return original(self)

    return reset_metrics
