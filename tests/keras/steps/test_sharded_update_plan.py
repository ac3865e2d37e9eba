"""Which models' optimizer updates ``fit`` may shard over the processes, and how an optimizer's
variables map onto its clone over the parts (``keras.steps.sharded_update``). Training with it, over
real processes, is tested in tests/multiprocess/test_sharded_update.py."""

import keras
import pytest

import stratax as sx
from stratax._src.keras.steps import sharded_update

ELEMENT_WISE = ["SGD", "Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta",
                "Lion"]


def _model(optimizer, dtype="float32"):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5, dtype=dtype),
                              keras.layers.Dense(2, dtype=dtype)])
    model.compile(optimizer=optimizer, loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("name", ELEMENT_WISE)
def test_every_slot_of_an_element_wise_optimizer_maps_onto_its_part(name):
    model = _model(getattr(keras.optimizers, name)())
    assert sharded_update.model_problem(model) is None
    layout = sharded_update.plan(model, 2)
    assert not isinstance(layout, str), layout
    optimizer = model.optimizer
    assert sorted(layout.sources) == list(range(len(optimizer.variables)))  # each one once
    assert layout.parts == (8, 3, 5, 1)  # 15, 5, 10 and 2 elements over 2, rounded up
    assert any(owner is not None for owner in layout.owners) == (name != "SGD")
    for variable, source, owner in zip(layout.optimizer.variables, layout.sources,
                                       layout.owners, strict=True):
        original = optimizer.variables[source]
        if owner is None:  # the step count, the learning rate, Nadam's running product
            assert variable.shape == original.shape
            continue
        assert variable.shape == (layout.parts[owner],)
        kind = variable.name.removeprefix(f"stratax_update_part_{owner}_")
        path = model.trainable_variables[owner].path.replace("/", "_")
        assert original.name == f"{path}_{kind}"
        assert original.shape == model.trainable_variables[owner].shape


def test_sgd_with_momentum_has_one_slot_per_variable():
    model = _model(keras.optimizers.SGD(momentum=0.9))
    layout = sharded_update.plan(model, 3)
    assert sorted(o for o in layout.owners if o is not None) == [0, 1, 2, 3]
    assert layout.parts == (5, 2, 4, 1)


class _MyAdam(keras.optimizers.Adam):
    pass


@pytest.mark.parametrize("make, reason", [
    (lambda: keras.optimizers.Adafactor(), "Adafactor is not one of the element-wise"),
    (lambda: _MyAdam(), "_MyAdam is not one of the element-wise"),
    (lambda: keras.optimizers.Adam(clipnorm=1.0), "clips by clipnorm"),
    (lambda: keras.optimizers.Adam(global_clipnorm=1.0), "clips by global_clipnorm"),
    (lambda: keras.optimizers.Adam(use_ema=True), "EMA"),
    (lambda: keras.optimizers.Adam(gradient_accumulation_steps=2), "accumulates"),
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
     "LossScaleOptimizer is not one"),
])
def test_an_update_that_reads_other_elements_stays_replicated(make, reason):
    problem = sharded_update.model_problem(_model(make()))
    assert problem is not None and reason in problem, problem


def test_excluded_weight_decay_and_other_dtypes_stay_replicated():
    optimizer = keras.optimizers.AdamW(weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    assert "weight decay excludes" in sharded_update.model_problem(_model(optimizer))
    problem = sharded_update.model_problem(_model(keras.optimizers.Adam(), dtype="float16"))
    assert "not float32" in problem


def test_the_switch_and_what_the_strategy_allows(monkeypatch):
    model = _model(keras.optimizers.Adam())
    strategy = sx.MirroredStrategy(["cpu:0"])
    assert sharded_update.why_not(model, strategy, 1) == "steps_per_execution is 1"
    # One process: there is no shared-memory transport to shard over.
    assert sharded_update.why_not(model, strategy, 32) == (
        "the all-reduce is not over shared memory on one host")
    monkeypatch.setenv("STRATAX_SHARDED_UPDATE", "off")
    assert sharded_update.why_not(model, strategy, 32) == "STRATAX_SHARDED_UPDATE=off"
    monkeypatch.setenv("STRATAX_SHARDED_UPDATE", "yes")
    with pytest.raises(ValueError, match="STRATAX_SHARDED_UPDATE='yes' is not a sharded-update "
                                         "setting; use one of auto, off"):
        sharded_update.why_not(model, strategy, 32)
