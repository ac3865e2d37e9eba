"""Keras' built-in initializers as ``ShardRecipe``s, so parameter servers build large variables.

Under ``ParameterServerStrategy`` a Keras variable of at least ``ps_build_on_servers_bytes``
(option; 64 MiB by default) whose initializer is one of Keras' built-ins (``Zeros``, ``Ones``,
a scalar ``Constant``, ``RandomUniform``, ``RandomNormal``, ``TruncatedNormal``, and
``VarianceScaling`` with its Glorot, He and LeCun forms) is never built on the chief: each
parameter server builds its own shards from the recipe (``parameter_server.shard_init``). The
values follow the initializer's distribution and seed, the same for any partitioning, run
after run, but are not the bits Keras draws for the whole variable; smaller variables, and
every variable whose initializer has no recipe, are built by Keras as under any strategy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from keras import initializers, random

from stratax._src.core.config import config
from stratax._src.parameter_server.shard_init import ShardRecipe, mark_remote


def recipe_for(initializer: Any) -> ShardRecipe | None:
    """The recipe of a Keras built-in ``initializer`` (an instance or its name), else
    ``None``."""
    if isinstance(initializer, str):
        try:
            initializer = initializers.get(initializer)
        except ValueError:
            return None
    kind = type(initializer)
    if kind is initializers.Zeros:
        return ShardRecipe("constant", {"value": 0.0})
    if kind is initializers.Ones:
        return ShardRecipe("constant", {"value": 1.0})
    if kind is initializers.Constant and np.ndim(initializer.value) == 0:
        return ShardRecipe("constant", {"value": float(initializer.value)})
    if kind is initializers.RandomUniform:
        params = {"minval": float(initializer.minval), "maxval": float(initializer.maxval)}
        return ShardRecipe("uniform", params, _seed(initializer.seed))
    if kind in (initializers.RandomNormal, initializers.TruncatedNormal):
        params = {"mean": float(initializer.mean), "stddev": float(initializer.stddev)}
        name = "normal" if kind is initializers.RandomNormal else "truncated_normal"
        return ShardRecipe(name, params, _seed(initializer.seed))
    if isinstance(initializer, initializers.VarianceScaling) \
            and type(initializer).__call__ is initializers.VarianceScaling.__call__:
        params = {"scale": float(initializer.scale), "mode": initializer.mode,
                  "distribution": initializer.distribution}
        return ShardRecipe("variance_scaling", params, _seed(initializer.seed))
    return None


def built_on_servers(variable: Any, initializer: Any) -> ShardRecipe | None:
    """The recipe when ``variable`` is to be built by its parameter servers (large enough, a
    recipe exists; noted on the variable with ``mark_remote``), else ``None`` (Keras builds it
    here)."""
    threshold = config.ps_build_on_servers_bytes
    if not threshold:
        return None
    nbytes = math.prod(variable.shape) * np.dtype(variable.dtype).itemsize
    if nbytes < threshold or not np.issubdtype(np.dtype(variable.dtype), np.number):
        return None
    recipe = recipe_for(initializer)
    if recipe is not None:
        mark_remote(variable, recipe)
    return recipe


def _seed(seed: Any) -> int:
    """An int seed of an initializer's ``seed`` (an int, or a ``keras.random.SeedGenerator``:
    its configured seed, else its current state)."""
    if isinstance(seed, random.SeedGenerator):
        configured = seed.get_config().get("seed")
        if configured is not None:
            return int(configured)
        state = np.asarray(seed.state.value).astype(np.int64).ravel()
        return int(np.random.SeedSequence([int(s) & (2**63 - 1) for s in state])
                   .generate_state(1)[0])
    return int(seed)
