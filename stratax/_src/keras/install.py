"""The one install step of stratax: plug the strategies into Keras (called by ``stratax``).

It checks that Keras and JAX are in the tested range, registers the default strategy and each
strategy's Keras runner, makes ``scope()`` lay Keras variables out for the strategy, and
installs the Keras hooks listed in ``stratax._src.seam``. It runs once per process, the first
time a program touches a part of stratax that needs JAX or Keras.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from jax.experimental import multihost_utils

from stratax._src import seam
from stratax._src.core import context
from stratax._src.keras import call_stack, distribution, methods, saving
from stratax._src.keras.runners.mesh_runner import MeshRunner
from stratax._src.keras.runners.ps_runner import ParameterServerRunner
from stratax._src.keras.runners.runner import register_runner, runner_for
from stratax._src.keras.runners.tpu_runner import TPURunner
from stratax._src.keras.steps import epoch_logs, metric_reset
from stratax._src.parameter_server.strategy import ParameterServerStrategy
from stratax._src.strategies import run_compiler
from stratax._src.strategies.base import Strategy
from stratax._src.strategies.default import DefaultStrategy
from stratax._src.strategies.tpu import TPUStrategy

_installed = False


@contextlib.contextmanager
def _keras_scope(strategy: Any) -> Iterator[None]:
    """Scope hook: inside ``strategy.scope()`` Keras lays variables out for the strategy."""
    if getattr(strategy, "is_default", False):
        yield
        return
    if getattr(strategy, "is_multi_process", False):
        _agree_on_random_seed()
    with runner_for(strategy).placement_scope():
        yield


def _agree_on_random_seed() -> None:
    """Gives every worker the same Keras seed, so variables start equal everywhere.

    TensorFlow broadcasts initial values from the chief; here every worker initialises the
    same values from one seed, drawn by worker 0 when the program set none.
    """
    if seam.keras_random_seed() is not None:
        return
    import keras

    seed = np.asarray(np.random.SeedSequence().generate_state(1)[0] >> 1, dtype=np.int64)
    keras.utils.set_random_seed(int(multihost_utils.broadcast_one_to_all(seed)))


def install() -> None:
    """Plugs stratax into Keras (idempotent; see the module docstring)."""
    global _installed
    if _installed:
        return
    seam.check_versions()
    context.set_default_strategy_factory(DefaultStrategy)
    register_runner(Strategy, MeshRunner)
    register_runner(TPUStrategy, TPURunner)
    register_runner(ParameterServerStrategy, ParameterServerRunner)
    context.register_scope_hook(_keras_scope)
    run_compiler.register_variable_source(distribution.created_variables)
    seam.install_keras_hooks(
        model_method=methods.model_method,
        save_method=saving.save_method,
        load_weights_method=saving.load_weights_method,
        reset_metrics_method=metric_reset.reset_metrics_method,
        metrics_result_or_logs_method=epoch_logs.metrics_result_or_logs_method,
        make_step=methods.make_step,
        epoch_batches=call_stack.epoch_batches,
    )
    _installed = True

