"""The Keras ``Model`` methods of a model bound to a strategy, routed through the strategy's runner.

``model.fit(...)`` of such a model: bind the arguments, let the runner turn the input into its
feed (``KerasRunner.prepare``), then run Keras' own ``fit`` inside the runner's placement, with
the runner's step plan (``make_step``, ``keras.steps.plan``) and batches (``feed_batches``). A
model of no strategy runs exactly as plain Keras. A call that fails leaves the model as its last
completed step left it (``keras.failed_calls``), from the states the steps record in the running
call.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from stratax._src import seam
from stratax._src.keras import binding, call_stack, failed_calls
from stratax._src.keras.callbacks import worker_dirs, worker_metrics
from stratax._src.keras.feed import GlobalFeed
from stratax._src.keras.runners.runner import runner_for

_BATCHED_METHODS = ("fit", "evaluate", "predict")
# The step a method compiles: Keras' train_step, test_step or predict_step.
_STEP_KINDS = {"fit": "train", "train_on_batch": "train", "evaluate": "test",
               "test_on_batch": "test", "predict": "predict", "predict_on_batch": "predict"}


def _bind(method: Callable[..., Any], args: tuple[Any, ...],
          kwargs: dict[str, Any]) -> dict[str, Any]:
    arguments = inspect.signature(method).bind_partial(None, *args, **kwargs).arguments
    arguments.pop("self", None)
    arguments.update(arguments.pop("kwargs", {}))
    return arguments


def model_method(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a Keras ``Model`` method) for models bound to a strategy."""

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = binding.model_strategy(self)
        if strategy is None:
            return original(self, *args, **kwargs)
        if name == "compile":
            binding.bind(self, strategy)
        runner = runner_for(strategy)
        call = call_stack.Call(runner, name, self)
        if name in _BATCHED_METHODS:
            kwargs = runner.prepare(name, _bind(original, args, kwargs))
            if name == "fit":
                kwargs["callbacks"] = worker_metrics.with_default_reporter(kwargs.get("callbacks"))
                worker_metrics.agree_on_probe(kwargs["callbacks"], strategy)
            args = ()
            x = kwargs.get("x")
            call.feed = x if isinstance(x, GlobalFeed) else None
            if call.feed is not None and call.feed.num_batches != 0:
                with runner.placement_scope():
                    seam.build_for(self, name, call.feed.build_batch)
        with call_stack.running(call), \
                worker_dirs.worker_log_dirs(kwargs.get("callbacks"), strategy):
            try:
                with warnings.catch_warnings():
                    # A run resumed mid-epoch ends that epoch's data early, on purpose.
                    warnings.filterwarnings("ignore", message="Your input ran out of data")
                    return runner.call(lambda: original(self, *args, **kwargs))
            except BaseException:  # KeyboardInterrupt too: the model must stay usable
                kind = _STEP_KINDS.get(name)
                if kind is not None:
                    failed_calls.restore_last_step(self, kind, call.state)
                raise
            finally:
                runner.finish()

    return method


def make_step(model: Any, build: Callable[[Callable[..., Any]], Callable[..., Any]],
              step_function: Callable[..., Any]) -> Callable[..., Any]:
    """How ``model`` runs a group of steps: its runner's step plan (``keras.steps.plan``), else
    Keras' own (``build``) for a model of no strategy or a step outside a running call."""
    strategy = binding.model_strategy(model)
    call = call_stack.active()
    kind = None if call is None else _STEP_KINDS.get(call.method)
    if strategy is None or kind is None:
        return build(step_function)
    return runner_for(strategy).make_step(model, kind, step_function)
