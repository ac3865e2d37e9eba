"""Initial values built where they are kept: each parameter server builds its own shards.

A ``ShardRecipe`` describes an initializer (Keras' built-in ones: constants, uniform, normal,
truncated normal, variance scaling) in plain JSON, so the chief sends the recipe instead of the
values and never holds a table whole. ``build_rows`` runs on the ps, in numpy, and gives rows
``start .. start + rows`` of the whole variable:

- **Independent of the partitioning.** Random values are drawn per block of ``BLOCK_ROWS`` rows
  from a generator seeded by ``(seed, block)``, so a row has the same value whatever the shard,
  the number of shards or parameter servers holding it, run after run.
- **Fans of the whole variable.** Variance scaling uses the whole shape's fans (TensorFlow's
  ``partition_shape`` rule), so a shard has the distribution of the unsharded variable.
- **Not Keras' bits.** The values follow the initializer's distribution but not the stream of
  JAX's generator, so they differ from the same initializer run whole (TensorFlow's
  partition-aware initializers differ from their unsharded build too).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

BLOCK_ROWS = 1024
KINDS = ("constant", "uniform", "normal", "truncated_normal", "variance_scaling")
_MODES = ("fan_in", "fan_out", "fan_avg")
_DISTRIBUTIONS = ("truncated_normal", "untruncated_normal", "uniform")
# Keras' (and TensorFlow's) stddev of a unit normal truncated at two standard deviations.
_TRUNCATED_STDDEV = 0.87962566103423978


@dataclasses.dataclass(frozen=True)
class ShardRecipe:
    """How every parameter server builds its shards of one variable (see the module docstring).

    ``kind`` is one of ``KINDS``; ``params`` its parameters (``value``; ``minval``/``maxval``;
    ``mean``/``stddev``; ``scale``/``mode``/``distribution``), ``seed`` an int.

    Example:
      >>> recipe = ShardRecipe("uniform", {"minval": -0.05, "maxval": 0.05}, seed=7)
      >>> build_rows(recipe, 0, 2, (10, 3), np.dtype("float32")).shape
      (2, 3)
    """

    kind: str
    params: dict[str, Any]
    seed: int = 0

    def describe(self) -> dict[str, Any]:
        """JSON-ready form, as the wire carries it (``from_description`` reads it back)."""
        return {"kind": self.kind, "params": dict(self.params), "seed": int(self.seed)}

    @classmethod
    def from_description(cls, description: Any) -> ShardRecipe:
        """Reads ``describe()``'s form, checked (it arrives from the chief over the wire).

        Raises:
          ValueError: an unknown kind, or a parameter missing or of the wrong type.
        """
        if not isinstance(description, dict):
            raise ValueError(f"A shard recipe is a dict, got {type(description).__name__}.")
        kind, params, seed = (description.get("kind"), description.get("params"),
                              description.get("seed", 0))
        if kind not in KINDS or not isinstance(params, dict) or not isinstance(seed, int):
            raise ValueError(f"Not a shard recipe: {description!r}; kind must be one of {KINDS}.")
        recipe = cls(kind, dict(params), seed)
        recipe._check()
        return recipe

    def _check(self) -> None:
        needed = {"constant": ("value",), "uniform": ("minval", "maxval"),
                  "normal": ("mean", "stddev"), "truncated_normal": ("mean", "stddev"),
                  "variance_scaling": ("scale",)}[self.kind]
        for key in needed:
            if not isinstance(self.params.get(key), (int, float)) \
                    or isinstance(self.params.get(key), bool):
                raise ValueError(f"Shard recipe {self.kind!r} needs a number {key!r}, got "
                                 f"{self.params!r}.")
        if self.kind == "variance_scaling" and (
                self.params.get("mode") not in _MODES
                or self.params.get("distribution") not in _DISTRIBUTIONS):
            raise ValueError(f"Shard recipe 'variance_scaling' needs mode in {_MODES} and "
                             f"distribution in {_DISTRIBUTIONS}, got {self.params!r}.")


def mark_remote(variable: Any, recipe: ShardRecipe) -> None:
    """Notes on a Keras ``variable`` that its servers build it from ``recipe``."""
    variable.stratax_shard_recipe = recipe


def remote_recipe(variable: Any) -> ShardRecipe | None:
    """The recipe its servers build ``variable`` from (``mark_remote``), else ``None``."""
    recipe = getattr(variable, "stratax_shard_recipe", None)
    return recipe if isinstance(recipe, ShardRecipe) else None


def build_rows(recipe: ShardRecipe, start: int, rows: int, shape: tuple[int, ...],
               dtype: np.dtype) -> np.ndarray:
    """Rows ``start .. start + rows`` of the variable of ``shape`` that ``recipe`` builds.

    Memory: the result plus one block of ``BLOCK_ROWS`` rows in float64.
    """
    shape = tuple(int(d) for d in shape)
    if not shape:  # a scalar: one "row"
        return build_rows(recipe, 0, 1, (1,), dtype).reshape(())
    if start < 0 or rows < 0 or start + rows > shape[0]:
        raise ValueError(f"Rows {start}..{start + rows} are outside a variable of shape "
                         f"{shape}.")
    out = np.empty((rows, *shape[1:]), dtype)
    if recipe.kind == "constant":
        out[...] = recipe.params["value"]
        return out
    draw = _drawer(recipe, shape)
    first, last = start // BLOCK_ROWS, (start + rows - 1) // BLOCK_ROWS if rows else -1
    for block in range(first, last + 1):
        block_start = block * BLOCK_ROWS
        block_rows = min(BLOCK_ROWS, shape[0] - block_start)
        rng = np.random.default_rng(np.random.SeedSequence([recipe.seed & (2**63 - 1), block]))
        values = draw(rng, (block_rows, *shape[1:]))
        lo, hi = max(start, block_start), min(start + rows, block_start + block_rows)
        out[lo - start:hi - start] = values[lo - block_start:hi - block_start]
    return out


def _drawer(recipe: ShardRecipe, shape: tuple[int, ...]) -> Any:
    p = recipe.params
    if recipe.kind == "uniform":
        return lambda rng, size: rng.uniform(p["minval"], p["maxval"], size)
    if recipe.kind == "normal":
        return lambda rng, size: rng.normal(p["mean"], p["stddev"], size)
    if recipe.kind == "truncated_normal":
        return lambda rng, size: p["mean"] + p["stddev"] * _truncated_unit_normal(rng, size)
    scale = p["scale"] / max(1.0, _fan(shape, p["mode"]))
    if p["distribution"] == "truncated_normal":
        stddev = math.sqrt(scale) / _TRUNCATED_STDDEV
        return lambda rng, size: stddev * _truncated_unit_normal(rng, size)
    if p["distribution"] == "untruncated_normal":
        return lambda rng, size: rng.normal(0.0, math.sqrt(scale), size)
    limit = math.sqrt(3.0 * scale)
    return lambda rng, size: rng.uniform(-limit, limit, size)


def _truncated_unit_normal(rng: np.random.Generator, size: tuple[int, ...]) -> np.ndarray:
    """Unit normal values redrawn until inside two standard deviations (Keras' truncation)."""
    values = rng.standard_normal(size)
    outside = np.abs(values) > 2.0
    while outside.any():
        values[outside] = rng.standard_normal(int(outside.sum()))
        outside = np.abs(values) > 2.0
    return values


def _fan(shape: tuple[int, ...], mode: str) -> float:
    """Keras' ``compute_fans`` of the whole shape, then the mode's fan."""
    if len(shape) == 1:
        fan_in = fan_out = shape[0]
    elif len(shape) == 2:
        fan_in, fan_out = shape
    else:
        receptive = math.prod(shape[:-2])
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
    return {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
