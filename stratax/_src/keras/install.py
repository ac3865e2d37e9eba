"""The one install step of stratax: plug the strategies into Keras (called by ``stratax``).

It checks that Keras and JAX are in the tested range, registers the default strategy and each
strategy's Keras runner, makes ``scope()`` lay Keras variables out for the strategy (and record
them as its: ``strategy.extended.variable_created_in_scope``), and installs the Keras hooks
listed in ``stratax._src.seam``. It runs once per process, the first
time a program touches a part of stratax that needs JAX or Keras.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from stratax._src import seam
from stratax._src.core import context
from stratax._src.keras import call_stack, distribution, methods, saving
from stratax._src.keras.runners.mesh_runner import MeshRunner
from stratax._src.keras.runners.ps_runner import ParameterServerRunner
from stratax._src.keras.runners.runner import register_runner, runner_for
from stratax._src.keras.runners.tpu_runner import TPURunner
from stratax._src.keras.seeds import AGREED_SEEDS
from stratax._src.keras.steps import epoch_logs, metric_reset
from stratax._src.parameter_server.strategy import ParameterServerStrategy
from stratax._src.strategies import extended, run_compiler
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
    seeds = (AGREED_SEEDS.scope() if getattr(strategy, "is_multi_process", False)
             else contextlib.nullcontext())
    def record(variable: Any) -> None:
        extended.mark_created(variable, strategy)

    with seeds, seam.keras_variables_created(record), runner_for(strategy).placement_scope():
        yield


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
        get_weights_method=saving.get_weights_method,
        reset_metrics_method=metric_reset.reset_metrics_method,
        metrics_result_or_logs_method=epoch_logs.metrics_result_or_logs_method,
        make_step=methods.make_step,
        epoch_batches=call_stack.epoch_batches,
    )
    _installed = True

