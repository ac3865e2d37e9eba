"""``fit``'s packed train step: one all-reduce of one flat buffer, the same training as GSPMD's.

The count of all-reduces is read from XLA's compiled HLO on 2 forced CPU devices (cheap and
deterministic); the multi-process equivalence tests cover the same step between processes.
"""

import re

import jax
import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.keras.steps import group_step, packed_step

_ALL_REDUCE = re.compile(r"=\s*(\(.*?\)|\S+)\s+all-reduce(?:-start)?\(")


def _model(*middle):
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                             *middle, keras.layers.Dense(5)])


def _compiled(model):
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _state_and_batch(model, strategy, rows=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 12)).astype(np.float32)
    y = rng.integers(0, 5, rows)
    model.fit(x, y, batch_size=rows, epochs=1, verbose=0)  # builds the optimizer and metrics
    sharding = jax.sharding.NamedSharding(strategy.mesh, jax.sharding.PartitionSpec("replica"))
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in model.optimizer.variables],
        [v.value for v in model.metrics_variables],
    )
    return state, (jax.device_put(x, sharding), jax.device_put(y, sharding))


def _reduced_buffers(hlo_text):
    """The buffers all-reduced by an optimized HLO module, e.g. ``["f32[208]", "f32[89]"]``.

    XLA may combine several all-reduces into one of a tuple, but its CPU runtime still calls the
    transport once per buffer: the buffer count is what costs round trips.
    """
    shapes = " ".join(_ALL_REDUCE.findall(hlo_text))
    return re.findall(r"[a-z]+\d*\[[\d,]*\]", shapes)


def test_fit_step_all_reduces_one_flat_buffer():
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = _compiled(_model())
    state, batch = _state_and_batch(model, strategy)
    step = packed_step.compiled_packed_step(model, strategy, state)
    # Gradients (4 tensors, 293 numbers) and metric updates (loss and accuracy totals and
    # counts): all float32, so one flat buffer.
    assert _reduced_buffers(step.lower(state, batch).compile().as_text()) == ["f32[297]"]
    trainable, non_trainable = state[0], state[1]

    def gspmd_gradients(trainable, x, y):  # the loss's gradients as plain jit partitions them
        def loss(values):
            logits, _ = model.stateless_call(values, non_trainable, x)
            return model.loss(y, logits)
        return jax.grad(loss)(trainable)

    compiled = jax.jit(gspmd_gradients).lower(trainable, *batch).compile()
    gspmd = _reduced_buffers(compiled.as_text())
    assert len(gspmd) >= 4, gspmd  # what the packed step replaces: one buffer per gradient


def test_the_steps_return_their_state_placed_as_the_variables_are():
    """Equal placements written differently (Keras' ``P(None,)`` and jit's ``P()``) are
    different keys of jit's dispatch cache: the group program returned 1-D state as ``P()``,
    so the first group of every fit's second epoch missed the cache and took JAX's slow
    Python path."""
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = _compiled(_model())
    state, batch = _state_and_batch(model, strategy)
    placed = [leaf.sharding for leaf in jax.tree.leaves(state)]
    assert jax.sharding.PartitionSpec(None) in [s.spec for s in placed]  # Keras' layout
    step = packed_step.compiled_packed_step(model, strategy, state)
    group, _ = group_step.programs(step, packed_step.output_shardings(strategy, state))
    _, state = step(state, batch)
    assert [leaf.sharding for leaf in jax.tree.leaves(state)] == placed
    _, state = group(state, [batch, batch])
    assert [leaf.sharding for leaf in jax.tree.leaves(state)] == placed


def test_bytes_per_pack_cuts_the_buffer_into_packs():
    mirrored = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    with mirrored.scope():
        model = _compiled(_model())
    state, batch = _state_and_batch(model, mirrored)

    class Packed:  # MultiWorkerMirroredStrategy's CommunicationOptions(bytes_per_pack=1024)
        num_replicas_in_sync = 2
        mesh = mirrored.mesh
        cross_device_ops = mirrored.cross_device_ops
        bytes_per_pack = 1024

    step = packed_step.compiled_packed_step(model, Packed, state)
    # 12x16 kernel + bias (832 B) fill one 1 KiB pack; the 16x5 kernel, its bias and the 4
    # metric numbers another.
    assert sorted(_reduced_buffers(step.lower(state, batch).compile().as_text())) == [
        "f32[208]", "f32[89]"]


@pytest.mark.parametrize("steps_per_execution", [1, 2])
def test_fit_uses_the_packed_step_and_matches_one_device(monkeypatch, steps_per_execution):
    """With steps_per_execution 2, each epoch's 3 batches run as one 2-step program (a scan
    over the arrays' rows: its step is traced once, in each fit) and one step alone (the group
    the epoch cannot fill)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(96, 12)).astype(np.float32)
    y = rng.integers(0, 5, 96)
    results = {}
    built, grouped = [], []
    original = packed_step.compiled_packed_step
    monkeypatch.setattr(packed_step, "compiled_packed_step",
                        lambda *a: built.append(a) or original(*a))
    original_group = group_step.programs

    def counting_group(traced_step, *rest):
        def traced(*args):
            grouped.append("traced")  # when a group program traces its step
            return traced_step(*args)
        return original_group(traced, *rest)

    monkeypatch.setattr(group_step, "programs", counting_group)
    for name, strategy in (("one", sx.OneDeviceStrategy("cpu:0")),
                           ("two", sx.MirroredStrategy(["cpu:0", "cpu:1"]))):
        keras.utils.set_random_seed(3)
        with strategy.scope():
            model = _compiled(_model())
            model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          steps_per_execution=steps_per_execution)
        history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        results[name] = (model.get_weights(), history.history)
    assert len(built) == 1  # the 2-replica fit took the packed step; one device needs none
    assert len(grouped) == (2 if steps_per_execution == 2 else 0)
    for got, want in zip(results["two"][0], results["one"][0], strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(results["two"][1][key], results["one"][1][key], rtol=1e-5)


@pytest.mark.parametrize("layers, loss, reason", [
    ((keras.layers.BatchNormalization(),), "sparse_categorical_crossentropy",
     "non-trainable variables"),
    ((keras.layers.Dropout(0.5),), "sparse_categorical_crossentropy", "non-trainable"),
    ((), keras.losses.SparseCategoricalCrossentropy(reduction="sum"), "'sum'"),
])
def test_models_it_would_change_keep_the_gspmd_step(layers, loss, reason):
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = _model(*layers)
        model.compile(optimizer="sgd", loss=loss)
    batch = (np.zeros((4, 12), np.float32), np.zeros((4,), np.int32))
    assert reason in packed_step.eligible(model, lambda: batch)
