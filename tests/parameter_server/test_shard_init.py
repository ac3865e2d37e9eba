"""Initial values built by the parameter servers (``shard_init``): each shard from a recipe,
the same rows whatever the partitioning, with the initializer's distribution; TensorFlow's
partition-aware initializers; Keras' built-in initializers as recipes."""

import itertools
import math

import keras
import numpy as np
import pytest

from stratax._src.keras.shard_recipes import recipe_for
from stratax._src.parameter_server.partitioners import build_shard, partition_aware
from stratax._src.parameter_server.shard_init import BLOCK_ROWS, ShardRecipe, build_rows
from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.transport import wire

F32 = np.dtype("float32")
RECIPES = [
    ShardRecipe("constant", {"value": 0.5}),
    ShardRecipe("uniform", {"minval": -0.05, "maxval": 0.05}, seed=3),
    ShardRecipe("normal", {"mean": 1.0, "stddev": 0.1}, seed=3),
    ShardRecipe("truncated_normal", {"mean": 0.0, "stddev": 0.2}, seed=3),
    ShardRecipe("variance_scaling", {"scale": 2.0, "mode": "fan_in",
                                     "distribution": "truncated_normal"}, seed=3),
]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.kind)
def test_rows_are_the_same_whatever_the_partitioning(recipe):
    shape = (3 * BLOCK_ROWS + 17, 5)
    whole = build_rows(recipe, 0, shape[0], shape, F32)
    for cuts in ([0, 1, shape[0]], [0, BLOCK_ROWS - 1, BLOCK_ROWS + 3, 2500, shape[0]]):
        parts = [build_rows(recipe, a, b - a, shape, F32) for a, b in itertools.pairwise(cuts)]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
    # Run after run the same; another seed other values (random kinds).
    np.testing.assert_array_equal(build_rows(recipe, 7, 40, shape, F32), whole[7:47])
    if recipe.kind != "constant":
        other = ShardRecipe(recipe.kind, recipe.params, seed=4)
        assert not np.array_equal(build_rows(other, 0, 100, shape, F32), whole[:100])


def test_values_follow_the_initializers_distribution():
    shape = (40_000, 25)
    uniform = build_rows(RECIPES[1], 0, shape[0], shape, F32)
    assert uniform.min() >= -0.05 and uniform.max() <= 0.05 and abs(uniform.mean()) < 1e-3
    normal = build_rows(RECIPES[2], 0, shape[0], shape, F32)
    assert abs(normal.mean() - 1.0) < 1e-3 and abs(normal.std() - 0.1) < 1e-3
    truncated = build_rows(RECIPES[3], 0, shape[0], shape, F32)
    assert np.abs(truncated).max() <= 0.4 + 1e-6        # two standard deviations
    assert abs(truncated.std() - 0.2 * 0.87962566) < 2e-3
    # Variance scaling takes the WHOLE shape's fans, as TensorFlow's partition_shape rule:
    # He normal over fan_in 40,000 (not a shard's rows), Keras' truncation constant undone.
    scaled = build_rows(RECIPES[4], 100, 1000, shape, F32)
    assert abs(scaled.std() - math.sqrt(2.0 / shape[0])) < 0.05 * math.sqrt(2.0 / shape[0])
    assert build_rows(RECIPES[0], 0, 1, (), F32).shape == ()


@pytest.mark.parametrize("initializer,kind", [
    ("zeros", "constant"), (keras.initializers.Ones(), "constant"),
    (keras.initializers.Constant(3.0), "constant"),
    (keras.initializers.RandomUniform(-1, 1, seed=5), "uniform"),
    (keras.initializers.RandomNormal(seed=5), "normal"),
    (keras.initializers.TruncatedNormal(seed=5), "truncated_normal"),
    ("glorot_uniform", "variance_scaling"), (keras.initializers.HeNormal(seed=5),
                                             "variance_scaling"),
])
def test_keras_builtins_become_recipes_with_their_parameters(initializer, kind):
    recipe = recipe_for(initializer)
    assert recipe is not None and recipe.kind == kind
    assert ShardRecipe.from_description(recipe.describe()) == recipe   # what the wire carries
    if kind == "uniform":
        assert recipe.params == {"minval": -1.0, "maxval": 1.0} and recipe.seed == 5
    if isinstance(initializer, keras.initializers.HeNormal):
        assert recipe.params == {"scale": 2.0, "mode": "fan_in",
                                 "distribution": "truncated_normal"}


def test_initializers_without_a_recipe_stay_with_keras():
    assert recipe_for(keras.initializers.Orthogonal()) is None
    assert recipe_for(keras.initializers.Constant(np.ones(3))) is None  # not a scalar
    assert recipe_for(lambda shape, dtype=None: np.zeros(shape)) is None


def test_tensorflows_partition_shape_and_offset_initializers():
    seen = []

    def init(partition_shape, partition_offset):
        seen.append((partition_shape, partition_offset))
        return np.full(partition_shape, partition_offset[0], np.float32)

    assert partition_aware(init) and partition_aware(lambda shard_info: 0)
    assert not partition_aware(lambda: 0)
    part = build_shard(init, "t", 4, 3, (10, 2), F32)
    assert seen == [((3, 2), (4, 0))] and part.tolist() == [[4, 4]] * 3

    def whole(**kwargs):  # takes the keywords but builds the whole variable: sliced, as in TF
        return np.arange(20, dtype=np.float32).reshape(10, 2)

    assert build_shard(whole, "t", 4, 3, (10, 2), F32).tolist() == [[8, 9], [10, 11], [12, 13]]
    with pytest.raises(ValueError, match=r"returned shape \(2,\)"):
        build_shard(lambda partition_shape, partition_offset: np.zeros(2), "t", 0, 3, (10, 2),
                    F32)


def test_the_ps_builds_its_shards_and_refuses_a_bad_recipe():
    server = ParameterServer()
    meta = {"method": "build", "names": ["t/part_1"], "recipe": RECIPES[1].describe(),
            "shape": [5000, 4], "dtype": "float32", "starts": [2000], "rows": [3000]}
    server.handle(wire.Frame(meta, []))
    np.testing.assert_array_equal(server._shard("t/part_1").value,
                                  build_rows(RECIPES[1], 2000, 3000, (5000, 4), F32))
    for bad in [{"recipe": {"kind": "orthogonal", "params": {}}},
                {"recipe": {"kind": "uniform", "params": {"minval": "x", "maxval": 1}}},
                {"dtype": "object"}, {"starts": [4000]}, {"rows": [-1]}]:
        with pytest.raises(wire.WireError):
            server.handle(wire.Frame({**meta, "names": ["u"], **bad}, []))
    assert "u" not in server._shards
