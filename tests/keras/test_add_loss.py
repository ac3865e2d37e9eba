"""Losses a layer adds in its forward pass train as on one device under every strategy (issue 40).

TensorFlow's Keras-distribute correctness tests have a model without targets whose only loss is
a layer's ``self.add_loss(keras.ops.sum(inputs))``: a sum over the rows of the batch Keras gives
the layer. The packed step computed it on each replica's share and averaged the shares as if it
were a mean (the loss and gradient halved on 2 replicas); such models now take Keras' own step
over the global batch. Each case compares plain Keras with OneDevice and Mirrored on 1, 2 and 4
replicas: fit's history, the final weights and evaluate (loss and metric) to 1e-5.
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.keras.steps import forward_losses, packed_step

ROWS, BATCH = 24, 8
TOLERANCE = 1e-5


class AddLoss(keras.layers.Layer):
    """A layer that adds ``term(inputs)`` as a loss and passes its inputs on."""

    def __init__(self, term: str, **kwargs):
        super().__init__(**kwargs)
        self.term = term

    def call(self, inputs):
        if self.term == "sum":  # TensorFlow's no-target test model
            self.add_loss(keras.ops.sum(inputs))
        elif self.term == "mean":
            self.add_loss(keras.ops.mean(inputs))
        else:  # nonlinear in the batch: no mix of per-replica values gives it
            self.add_loss(keras.ops.square(keras.ops.mean(inputs)) + keras.ops.max(inputs))
        return inputs


def _data():
    rng = np.random.default_rng(0)
    x = rng.random((ROWS, 3)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)


def _model(term):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, kernel_regularizer="l2", activity_regularizer="l1")(inputs)
    outputs = keras.layers.Dense(1)(AddLoss(term)(hidden))
    return keras.Model(inputs, outputs)


def _run(strategy, term="sum", with_targets=False, steps_per_execution=1, sgd=True):
    """fit (3 epochs, no shuffling), then evaluate: (history, weights, evaluate's results)."""
    x, y = _data()
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = _model(term)
        model.compile(optimizer=keras.optimizers.SGD(0.001) if sgd else keras.optimizers.Adam(0.01),
                      loss="mse" if with_targets else None,
                      metrics=["mae"] if with_targets else None,
                      steps_per_execution=steps_per_execution)
    targets = y if with_targets else None
    history = model.fit(x, targets, batch_size=BATCH, epochs=3, shuffle=False, verbose=0)
    scores = model.evaluate(x, targets, batch_size=BATCH, verbose=0, return_dict=True)
    return history.history, model.get_weights(), scores


def _assert_same(got, want):
    (history, weights, scores), (ref_history, ref_weights, ref_scores) = got, want
    assert history.keys() == ref_history.keys() and scores.keys() == ref_scores.keys()
    for key in ref_history:
        assert len(history[key]) == 3
        np.testing.assert_allclose(history[key], ref_history[key], rtol=TOLERANCE,
                                   atol=TOLERANCE, err_msg=key)
    for key in ref_scores:
        np.testing.assert_allclose(scores[key], ref_scores[key], rtol=TOLERANCE,
                                   atol=TOLERANCE, err_msg=key)
    for a, b in zip(weights, ref_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.fixture(scope="module")
def plain():
    """Plain Keras (no strategy) for each case, computed once; the issue's case at once (Keras'
    own data path imports TensorFlow, which sets environment variables, before any test)."""
    return {(): _run(None)}


def _plain(plain, **case):
    key = tuple(sorted(case.items()))
    if key not in plain:
        plain[key] = _run(None, **case)
    return plain[key]


@pytest.mark.parametrize("replicas", [0, 1, 2, 4])
def test_no_target_sum_loss_equals_one_device(plain, replicas):
    """The issue's model: fit without targets, the loss a sum over the batch's rows."""
    strategy = (sx.OneDeviceStrategy("cpu:0") if replicas == 0
                else sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)]))
    want = _plain(plain)
    _assert_same(_run(strategy), want)
    assert want[0]["loss"][-1] < want[0]["loss"][0] - 2  # the added loss is what trains


@pytest.mark.parametrize("term", ["sum", "mean", "nonlinear"])
@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_added_losses_with_targets_equal_one_device_on_4_replicas(plain, term,
                                                                  steps_per_execution):
    """A compiled loss and metric beside the added term; groups of steps (one program each)."""
    case = {"term": term, "with_targets": True, "steps_per_execution": steps_per_execution,
            "sgd": False}
    _assert_same(_run(sx.MirroredStrategy([f"cpu:{i}" for i in range(4)]), **case),
                 _plain(plain, **case))


def test_models_whose_forward_pass_adds_losses_keep_keras_step():
    """The packed step's eligibility names the cause; models without such losses still pack."""
    x, y = _data()
    strategy = sx.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = _model("sum")
        model.compile(optimizer="sgd", loss="mse")
        plain_model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
            2, kernel_regularizer="l2"), keras.layers.Dense(1)])
        plain_model.compile(optimizer="sgd", loss="mse")
    batch = (x[:BATCH], y[:BATCH])
    reason = packed_step.eligible(model, lambda: batch)
    assert "adds 2 loss term(s)" in reason  # add_loss and the activity regularizer
    assert packed_step.eligible(plain_model, lambda: batch) is None  # weight regularizer only
    assert forward_losses.count(plain_model, lambda: batch) == 0


def _tpu_strategy():
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=4)
    sx.tpu.experimental.initialize_tpu_system(resolver)
    return sx.TPUStrategy(resolver)


@pytest.fixture
def _fresh_tpu_system():
    from stratax._src.runtime import tpu_system

    yield
    tpu_system.system.resolver = tpu_system.system.topology = None


def test_tpu_full_batches_equal_one_device_and_a_padded_one_is_refused(plain, _fresh_tpu_system):
    """TPUStrategy runs Keras' step over the whole global batch: exact on full batches. A
    padded last batch would add the padding rows to the term, so it is refused, naming it."""
    strategy = _tpu_strategy()
    _assert_same(_run(strategy, with_targets=True), _plain(plain, with_targets=True))
    x, y = _data()
    with strategy.scope():
        model = _model("sum")
        model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match=r"padded.*adds 2 loss term"):
        model.fit(x[:ROWS - 4], y[:ROWS - 4], batch_size=BATCH, epochs=1, verbose=0)


class _SyncStrategy:
    """What ``ps_steps.replica_function`` reads of a ParameterServerStrategy in sync mode with
    ``workers`` workers (its steps refuse the model before reading any variable)."""

    def __init__(self, workers):
        self.num_replicas_in_sync = workers


def test_ps_sync_over_several_workers_refuses_added_losses(plain):
    """Each worker of a synchronous step sees its share of the batch: refused, naming the fix.
    Asynchronous steps and one worker run the whole batch (the refusal does not apply)."""
    from stratax._src.keras.steps import ps_steps

    x, y = _data()
    model = _model("sum")
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # builds the optimizer
    for kind, method in (("train", "fit"), ("test", "evaluate")):
        step = ps_steps.replica_function(model, kind, _SyncStrategy(2))
        with pytest.raises(ValueError, match=rf"model.{method} .*mode='sync'.* 2 workers.*"
                                             r"adds 2 loss term.*mode='async'"):
            step((x[:4], y[:4]))


class _SumOfInputs(keras.layers.Layer):
    """tf-keras' ``test_no_target_model`` layer: its inputs' sum is the model's only loss."""

    def call(self, inputs):
        self.add_loss(keras.ops.sum(inputs))
        return inputs


def _no_target_sequence(strategy):
    """tf-keras' ``test_no_target_model``: fit 2 steps, predict 1, evaluate 1, no targets."""
    x = np.random.default_rng(0).random((20, 10)).astype(np.float32)
    keras.utils.set_random_seed(1)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                                  _SumOfInputs(), keras.layers.Dense(2, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.001))
    history = model.fit(x, epochs=1, steps_per_epoch=2, shuffle=False, verbose=0)
    predictions = model.predict(x, steps=1, verbose=0)
    return history.history["loss"], predictions, model.evaluate(x, steps=1, verbose=0)


@pytest.mark.parametrize("replicas", [0, 1, 2])
def test_tf_keras_no_target_model_evaluates_as_plain_keras(replicas):
    """Issue 49 #8: evaluate after fit 2 steps + predict 1 step, against plain Keras, under
    OneDevice (0) and the mesh runner a one-worker MultiWorkerMirrored runs too (1, 2)."""
    strategy = (sx.OneDeviceStrategy("cpu:0") if replicas == 0
                else sx.MirroredStrategy([f"cpu:{i}" for i in range(replicas)]))
    loss, predictions, score = _no_target_sequence(strategy)
    want_loss, want_predictions, want_score = _no_target_sequence(None)
    np.testing.assert_allclose(loss, want_loss, rtol=TOLERANCE, atol=TOLERANCE)
    np.testing.assert_allclose(predictions, want_predictions, rtol=TOLERANCE, atol=TOLERANCE)
    np.testing.assert_allclose(score, want_score, rtol=TOLERANCE, atol=TOLERANCE)
    assert want_score > 1  # the added sum is what evaluate reports
