"""The step plan: one plan per step function, chosen on its first batch, executed directly.

``model.train_function`` (and its test and predict twins) under a strategy is a ``PlannedStep``
whose plan says which step runs, grouped or not, bounded or not; ``describe()`` says it in words
(docs/design/step-plan.md has the table). The plan calls the jitted programs itself: between
Keras' loop and a compiled program there are at most three stratax frames, all in the plan.
"""

import inspect
import sys

import jax
import keras
import numpy as np
import pytest

import stratax as sx
from stratax._src.keras.steps import plan as plan_lib

_JIT = type(jax.jit(lambda x: x))


def _data():
    rng = np.random.default_rng(2)
    return rng.normal(size=(96, 12)).astype(np.float32), rng.integers(0, 5, 96)


def _model(strategy, spe, *layers):
    keras.utils.set_random_seed(5)
    with strategy.scope():
        model = keras.Sequential([keras.Input((12,)), *(layer() for layer in layers),
                                  keras.layers.Dense(16, "relu"),
                                  keras.layers.Dense(5)])
        model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=spe)
    return model


def _fit(strategy, spe, *layers):
    x, y = _data()
    model = _model(strategy, spe, *layers)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return model


def _plan(function):
    if not isinstance(function, plan_lib.PlannedStep):  # Keras wraps its predict function
        function = inspect.getclosurevars(function).nonlocals["_step_function"]
    assert isinstance(function, plan_lib.PlannedStep), type(function)  # not wrapped
    return function.plan


def test_mirrored_fit_with_groups_plans_the_packed_group_program():
    model = _fit(sx.MirroredStrategy(["cpu:0", "cpu:1"]), 2)
    plan = _plan(model.train_function)
    assert plan.name == "train/packed+group2+rows"
    assert (plan.step, plan.group, plan.group_program, plan.state_logs) == ("packed", 2, True,
                                                                            True)
    assert not plan.committed and not plan.sharded_update  # one process: no sharded update
    text = plan.describe()
    assert text.startswith("train/packed+group2+rows: the packed train step")
    assert "over 2 replica(s)" in text and "A full group of 2 steps runs as one program" in text


def test_mirrored_model_the_packed_step_refuses_plans_keras_step_and_says_why():
    model = _fit(sx.MirroredStrategy(["cpu:0", "cpu:1"]), 1, lambda: keras.layers.Dropout(0.2))
    plan = _plan(model.train_function)
    assert plan.name == "train/keras"
    assert "non-trainable variables" in plan.note
    assert "(not packed: the model has non-trainable variables" in plan.describe()


def test_multi_worker_in_one_process_plans_the_packed_step():
    strategy = sx.MultiWorkerMirroredStrategy()
    model = _fit(strategy, 1)
    plan = _plan(model.train_function)
    assert plan.name == "train/packed+rows"
    assert plan.over == f"{strategy.num_replicas_in_sync} replica(s)"


def test_one_device_plans_for_fit_evaluate_and_predict():
    strategy = sx.OneDeviceStrategy("cpu:0")
    model = _fit(strategy, 3)
    x, y = _data()
    model.evaluate(x, y, batch_size=32, verbose=0)
    model.predict(x, batch_size=32, verbose=0)
    train, test, predict = (_plan(f) for f in (model.train_function, model.test_function,
                                               model.predict_function))
    assert train.name == "train/keras+group3+rows" and train.committed and train.over == str(
        strategy.devices[0])
    assert "The state is committed to the device." in train.describe()
    assert test.name == "test/keras+loop3" and not test.state_logs
    assert predict.name == "predict/keras+loop3"
    assert "Up to 3 steps per call, one after the other." in predict.describe()


def test_tpu_fit_plans_the_on_device_loop():
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", emulation_cores=8)
    sx.tpu.experimental.initialize_tpu_system(resolver)
    model = _fit(sx.TPUStrategy(resolver), 4)
    plan = _plan(model.train_function)
    assert plan.name == "train/tpu-loop+group4" and plan.over == "8 TPU replica(s)"
    assert "Each group of up to 4 steps is one on-device loop" in plan.describe()


def test_plans_are_logged_once_at_debug(caplog):
    with caplog.at_level("DEBUG", logger=plan_lib.__name__):
        model = _fit(sx.MirroredStrategy(["cpu:0", "cpu:1"]), 2)
        x, y = _data()
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    logged = [r.getMessage() for r in caplog.records if r.name == plan_lib.__name__]
    assert logged == ["step plan " + model.train_function.plan.describe()]


def test_a_fixed_plan_never_reads_the_iterator_itself():
    """Runners whose group function keeps its iterator (the parameter servers' pipeline tells
    epochs apart by it) get the very iterator Keras passed."""
    seen = []

    def whole(state, iterator):
        seen.append(iterator)
        return {"loss": 0.0}, state

    step = plan_lib.PlannedStep.fixed(plan_lib.StepPlan("train", step="scheduled", group=4,
                                                        group_program=True),
                                      plan_lib.StepPrograms(whole=whole))
    iterator = iter([1, 2, 3])
    assert step((0,), iterator) == ({"loss": 0.0}, (0,))
    assert seen == [iterator] and next(iterator) == 1
    assert step.plan.describe() == ("train/scheduled+group4: Keras' train step scheduled on the "
                                    "workers, one closure a group. Each group of up to 4 steps "
                                    "is one closure on a worker.")


def _stratax_frames(frame):
    """The stratax frames on the stack from ``frame`` up to the first that is not (Keras')."""
    names = []
    while frame is not None and "/stratax/" in frame.f_code.co_filename:
        names.append((frame.f_code.co_filename.rsplit("/", 1)[-1], frame.f_code.co_name))
        frame = frame.f_back
    return names


@pytest.mark.parametrize("strategy, spe", [
    (lambda: sx.MirroredStrategy(["cpu:0", "cpu:1"]), 1),
    (lambda: sx.MirroredStrategy(["cpu:0", "cpu:1"]), 2),
    (lambda: sx.OneDeviceStrategy("cpu:0"), 2),
    (lambda: sx.OneDeviceStrategy("cpu:0"), 1),
], ids=["mirrored", "mirrored-grouped", "one-device-grouped", "one-device"])
def test_the_plan_calls_jitted_programs_directly(strategy, spe):
    """Every program of the plan is a ``jax.jit`` function, and the plan calls it from at most
    three frames of its own (before: seven wrappers, across three modules and Keras' loop)."""
    strategy = strategy()
    model = _fit(strategy, spe)
    step = model.train_function
    programs = step._programs
    called = {name: getattr(programs, name) for name in ("keras_step", "own_step", "group",
                                                         "row_group")
              if getattr(programs, name) is not None}
    assert all(isinstance(program, _JIT) for program in called.values()), called
    depths = []

    def spy(program):
        def spied(*args):
            depths.append(_stratax_frames(sys._getframe(1)))
            return program(*args)
        return spied

    step._programs = programs.__class__(**{
        **vars(programs), **{name: spy(program) for name, program in called.items()}})
    x, y = _data()
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert depths, "no program ran"
    for frames in depths:
        assert 1 < len(frames) <= 3 and frames[-1] == ("plan.py", "__call__"), frames
        assert {file for file, _ in frames} == {"plan.py"}, frames


def test_the_base_runner_plans_keras_loop_and_joins_predict_outputs():
    """A runner that keeps Keras' behaviour (``KerasRunner``) plans Keras' loop: up to
    ``steps_per_execution`` steps per call, a predict group's outputs joined in order."""
    from stratax._src.keras.runners.runner import KerasRunner

    class Model:
        steps_per_execution, jit_compile, run_eagerly = 3, False, False

    def step(state, batch):
        return np.asarray([batch]), state + 1

    planned = KerasRunner(sx.OneDeviceStrategy("cpu:0")).make_step(Model(), "predict", step)
    batches = iter(range(5))
    outputs, state = planned(0, batches)
    assert planned.plan.name == "predict/keras+loop3"
    np.testing.assert_array_equal(outputs, [0, 1, 2])
    assert state == 3
    outputs, state = planned(state, batches)  # the epoch's short last group
    np.testing.assert_array_equal(outputs, [3, 4])
    assert state == 5
    with pytest.raises(StopIteration):
        planned(state, batches)
