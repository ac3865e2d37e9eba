"""A Keras ``SGD``/``Adam`` as the parameter servers keep its state: the optimizer's key (its
config and sparse rule, which a server's ``ShardOptimizer`` applies with Keras' formulas) and,
for a variable, the Keras slot variables under the servers' names (``m``, ``v``). Checkpoints
store the state under those names, so it means the same under every strategy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from stratax._src.parameter_server.program import optimizer_spec
from stratax._src.parameter_server.tasks.optimizers import DEFAULT_SPARSE_UPDATES, ShardOptimizer

# Keras' names of the optimizer slots the ps keeps as "m" and "v" (Keras creates them with
# ``add_variable_from_reference(var, name)``: path ``<optimizer>/<var path with _>_<name>``).
_KERAS_SLOTS = {"Adam": {"m": "momentum", "v": "velocity"}, "SGD": {"m": "momentum"}}


def keras_optimizer_state(optimizer: Any, variables: Sequence[Any]) -> tuple[str, Any]:
    """The ps' key of a Keras optimizer and a function giving a variable's slots by ps name."""
    if optimizer is None:
        return "", lambda var: {}
    spec = optimizer_spec(optimizer)
    template = ShardOptimizer(spec, np.zeros((1,), np.float32))  # checks it is SGD/Adam
    names = {k: v for k, v in _KERAS_SLOTS[template.name].items() if k in template.slots}
    by_path = {v.path: v for v in optimizer.variables}

    def slots_of(var: Any) -> dict[str, Any]:
        prefix = var.path.replace("/", "_")
        found = {ps_name: [v for p, v in by_path.items() if p.endswith(f"/{prefix}_{keras}")]
                 for ps_name, keras in names.items()}
        missing = [k for k, v in found.items() if len(v) != 1]
        if missing:
            raise ValueError(f"{type(optimizer).__name__} has no single {missing} slot for "
                             f"{var.path!r}; build it on these variables first.")
        return {k: v[0] for k, v in found.items()}

    sparse = getattr(optimizer, "stratax_sparse_updates", DEFAULT_SPARSE_UPDATES)
    return json.dumps({"spec": spec, "sparse": sparse}, sort_keys=True), slots_of
