"""``sx.experimental.PreemptionCheckpointHandler`` in one process (issue 49 #10).

A SIGTERM to this process (or a ``termination_watcher_fn`` saying so) makes the next ``run``
call save and exit; a handler made again restores the weights, the optimizer and
``total_run_calls``, and the loop resumes to the weights of an uninterrupted loop. The
two-worker case, with a real preemption, is tests/multiprocess/test_preemption_resume.py.
"""

import os
import signal

import keras
import numpy as np
import pytest

import stratax as sx

STEPS = 8


class Exited(Exception):
    """What the tests' exit_fn raises, in place of the program's exit."""


def _exit():
    raise Exited


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.05), "mse")
    model.optimizer.build(model.trainable_variables)
    model.set_weights([np.linspace(-1, 1, w.size, dtype="float32").reshape(w.shape)
                       for w in model.get_weights()])
    return model


def _batch(step):
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(4, 3) * (step + 1)
    return x, np.sin(x.sum(axis=1, keepdims=True))


def _train(model, handler, stop_at=None):
    for step in range(handler.total_run_calls, STEPS):
        if step == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)  # the preemption notice
        handler.run(model.train_on_batch, *_batch(step))


def _handler(model, directory, **config):
    return sx.experimental.PreemptionCheckpointHandler(
        sx.cluster_resolver.SimpleClusterResolver(sx.cluster_resolver.ClusterSpec({})),
        {"model": model, "optimizer": model.optimizer}, directory,
        sx.experimental.TerminationConfig(exit_fn=_exit, **config))


@pytest.fixture
def uninterrupted():
    model = _model()
    for step in range(STEPS):
        model.train_on_batch(*_batch(step))
    return model.get_weights()


def test_sigterm_saves_at_the_next_run_and_a_new_handler_resumes(tmp_path, uninterrupted):
    previous = signal.getsignal(signal.SIGTERM)
    model = _model()
    handler = _handler(model, tmp_path)
    assert handler.total_run_calls == 0
    with pytest.raises(Exited):
        _train(model, handler, stop_at=3)
    assert handler.total_run_calls == 4  # step 3 ran, then the save
    assert signal.getsignal(signal.SIGTERM) is previous  # SIGTERM is the program's again
    resumed = _model()  # a new process: fresh weights
    handler = _handler(resumed, tmp_path)
    assert handler.total_run_calls == 4
    assert int(resumed.optimizer.iterations.numpy()) == 4
    _train(resumed, handler)
    for got, want in zip(resumed.get_weights(), uninterrupted, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    handler._sigterm.give_back()  # the run ended without a notice: the test's handler back


def test_termination_watcher_and_save_fn(tmp_path):
    saved = []
    model = _model()
    handler = _handler(model, tmp_path, termination_watcher_fn=lambda: len(saved) == 0
                       and handler.total_run_calls == 2, save_fn=lambda: saved.append(1))
    with pytest.raises(Exited):
        _train(model, handler)
    assert saved == [1] and handler.total_run_calls == 2
    assert not os.listdir(tmp_path)  # save_fn replaced the checkpoint


def test_wrong_arguments_are_named():
    resolver = sx.cluster_resolver.SimpleClusterResolver(sx.cluster_resolver.ClusterSpec({}))
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        sx.experimental.PreemptionCheckpointHandler(resolver, _model())
    with pytest.raises(TypeError, match=r"checkpoint\['step'\] is a int; a checkpoint holds"):
        sx.experimental.PreemptionCheckpointHandler(resolver, {"step": 3}, "/tmp/x")
    with pytest.raises(ValueError, match="grace_period must be >= 0"):
        sx.experimental.TerminationConfig(grace_period=-1)


def test_a_checkpoint_of_other_objects_is_refused(tmp_path):
    model = _model()
    handler = _handler(model, tmp_path)
    with pytest.raises(Exited):
        _train(model, handler, stop_at=1)
    unbuilt = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    unbuilt.compile(keras.optimizers.Adam(0.05), "mse")  # its optimizer holds no state yet
    with pytest.raises(ValueError, match=r"build the optimizer before the handler.*does not "
                                         r"match this model and optimizer \(14 saved arrays, "
                                         r"4 variables now"):
        sx.experimental.PreemptionCheckpointHandler(
            sx.cluster_resolver.SimpleClusterResolver(sx.cluster_resolver.ClusterSpec({})),
            {"model": unbuilt}, tmp_path)


def test_experimental_mirrors_tensorflow_paths():
    assert sx.experimental.MultiWorkerMirroredStrategy is sx.MultiWorkerMirroredStrategy
    assert sx.experimental.CommunicationOptions is sx.CommunicationOptions
    assert sx.experimental.CommunicationImplementation is sx.CommunicationImplementation
    assert sx.experimental.ParameterServerStrategy is sx.ParameterServerStrategy
    assert sx.experimental.ValueContext is sx.ValueContext
    assert sx.experimental.coordinator is sx.coordinator
    assert sx.experimental.partitioners is sx.partitioners
