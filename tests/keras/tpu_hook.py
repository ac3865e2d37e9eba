"""Test-only wiring of ``TPURunner`` into ``model.fit``/``evaluate``/``predict``.

The Keras seam (issue 7) will call a strategy's runner itself. Until it lands, this context
manager routes the three methods of a model under a ``TPUStrategy`` through ``TPURunner`` by
patching, for the duration of a test only, the two places the bridge consults today: the
session that places batches and Keras' ``_make_function`` that builds the step loop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from keras.src.backend.jax import trainer as jax_trainer

from stratax._src.keras import bridge, session
from stratax._src.keras.tpu_runner import TPURunner
from stratax._src.strategies.tpu import TPUStrategy


class _RunnerSession:
    """What the bridge expects of a session, served by a ``TPURunner``."""

    def __init__(self, runner: TPURunner) -> None:
        self.runner = runner
        self.strategy = runner.strategy

    def placement_scope(self) -> contextlib.AbstractContextManager[Any]:
        return self.runner.placement_scope()

    def batches(self, data_adapter: Any) -> Iterator[Any]:
        return self.runner.batches(data_adapter)

    def resume_at(self, epoch: int, skip: int) -> None:
        raise RuntimeError("BackupAndRestore resume is not wired for TPURunner in these tests.")


@contextlib.contextmanager
def tpu_runner_hook() -> Iterator[dict[str, int]]:
    """Routes models under a TPUStrategy through TPURunner; yields counts of runner step
    functions made and of their calls (one call per ``steps_per_execution`` group)."""
    state = threading.local()
    counters = {"make_step": 0, "calls": 0}
    patch = pytest.MonkeyPatch()
    original_session = session.DataSession
    original_prepare = bridge._prepare_arguments
    original_make_function = jax_trainer.JAXTrainer._make_function

    def prepare(strategy: Any, method: Any, name: str, args: Any, kwargs: Any) -> Any:
        arguments = original_prepare(strategy, method, name, args, kwargs)
        if isinstance(strategy, TPUStrategy):
            state.runner = TPURunner(strategy)
            arguments = state.runner.prepare(name, arguments)
        return arguments

    def make_session(strategy: Any, distribution: Any) -> Any:
        runner = getattr(state, "runner", None)
        if isinstance(strategy, TPUStrategy) and runner is not None and runner.strategy is strategy:
            return _RunnerSession(runner)
        return original_session(strategy, distribution)

    def make_function(model: Any, step_function: Any, concatenate_outputs: bool = False) -> Any:
        current = session.active()
        if isinstance(current, _RunnerSession):
            counters["make_step"] += 1
            kind = "predict" if concatenate_outputs else getattr(state, "kind", "train")
            function = current.runner.make_step(model, kind, step_function)

            def counted(state: Any, iterator: Any) -> Any:
                counters["calls"] += 1
                return function(state, iterator)

            return counted
        return original_make_function(model, step_function, concatenate_outputs)

    def kind_setter(kind: str, original: Any) -> Any:
        def make(model: Any, force: bool = False) -> Any:
            state.kind = kind
            return original(model, force)
        return make

    patch.setattr(bridge, "_prepare_arguments", prepare)
    patch.setattr(session, "DataSession", make_session)
    patch.setattr(jax_trainer.JAXTrainer, "_make_function", make_function)
    for kind, name in (("train", "make_train_function"), ("test", "make_test_function")):
        patch.setattr(jax_trainer.JAXTrainer, name,
                      kind_setter(kind, getattr(jax_trainer.JAXTrainer, name)))
    try:
        yield counters
    finally:
        patch.undo()
