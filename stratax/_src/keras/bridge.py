"""Plugs stratax strategies into Keras: mirrored variables under ``scope()``, data-parallel ``fit``.

Keras 3 on JAX already knows how to train over a device mesh (``keras.distribution``: variables
replicated, batches sharded, XLA inserts the gradient all-reduce). What TensorFlow users expect on
top, and what this module adds:

- a model remembers the strategy it was built or compiled under, so ``fit``/``evaluate``/
  ``predict`` called *outside* ``scope()`` (as in TensorFlow's guides) still run distributed;
- ``batch_size`` is the global batch and must split over the replicas (clear error otherwise);
- the last, partial batch of an epoch is not dropped: it runs whole on every replica;
- on several CPU devices of one process, the host dispatches at most a few steps ahead, which
  avoids XLA's CPU all-reduce deadlock (see ``stratax._src.runtime.throttle``);
- mixing the scopes of two strategies is an error.

The Keras methods are wrapped once, on ``import stratax``; a model that has no strategy runs
exactly as plain Keras.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import keras
import numpy as np
from jax.experimental import multihost_utils
from keras.src.backend.jax import trainer as jax_trainer
from keras.src.trainers import trainer as base_trainer
from keras.src.utils import rng_utils

from stratax._src.core import context
from stratax._src.core.errors import MixedStrategyError
from stratax._src.keras import checkpoint_io, session
from stratax._src.keras.backup import BackupAndRestore
from stratax._src.keras.distribution import StrategyDistribution
from stratax._src.keras.inputs import BatchList, adapt_input
from stratax._src.keras.process_shard import shard_arguments
from stratax._src.runtime import distributed
from stratax._src.runtime.throttle import DispatchWindow
from stratax._src.strategies.base import Strategy
from stratax._src.strategies.default import DefaultStrategy

_STRATEGY_ATTR = "_stratax_strategy"
_KERAS_DEFAULT_BATCH = 32
_WRAPPED_MODEL_METHODS = (
    "compile", "fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch",
)
_BATCHED_METHODS = ("fit", "evaluate", "predict")

_distributions: "weakref.WeakKeyDictionary[Strategy, StrategyDistribution]" = (
    weakref.WeakKeyDictionary()
)
_strategy_by_mesh: "weakref.WeakValueDictionary[Any, Strategy]" = weakref.WeakValueDictionary()
_installed = False


def _distribution_if_needed(strategy: Strategy) -> StrategyDistribution | None:
    return distribution_for(strategy) if session.uses_mesh(strategy) else None


def distribution_for(strategy: Strategy) -> StrategyDistribution:
    """The Keras distribution of ``strategy`` (one per strategy, created on first use)."""
    dist = _distributions.get(strategy)
    if dist is None:
        dist = StrategyDistribution(strategy)
        _distributions[strategy] = dist
        _strategy_by_mesh[strategy.mesh] = strategy
    return dist


@contextlib.contextmanager
def _keras_scope(strategy: Any) -> Iterator[None]:
    """Scope hook: inside ``strategy.scope()`` Keras lays variables out with the strategy's mesh."""
    if isinstance(strategy, DefaultStrategy) or not isinstance(strategy, Strategy):
        yield
        return
    if strategy.is_multi_process:
        _agree_on_random_seed()
    with session.DataSession(strategy, _distribution_if_needed(strategy)).placement_scope():
        yield


def _agree_on_random_seed() -> None:
    """Gives every worker the same Keras seed, so variables start equal everywhere.

    TensorFlow broadcasts initial values from the chief; here every worker initialises the
    same values from one seed, drawn by worker 0 when the program set none.
    """
    if rng_utils.get_random_seed() is not None:
        return
    seed = np.asarray(np.random.SeedSequence().generate_state(1)[0] >> 1, dtype=np.int64)
    agreed = int(multihost_utils.broadcast_one_to_all(seed))
    rng_utils.set_random_seed(agreed)


def model_strategy(model: Any) -> Strategy | None:
    """The strategy ``model`` belongs to: the one it was compiled or built under, else the scope's.

    Raises:
        MixedStrategyError: the model belongs to one strategy and another's scope is active.
    """
    bound = getattr(model, _STRATEGY_ATTR, None) or _strategy_from_variables(model)
    scoped = context.current_scope_strategy()
    if bound is not None and scoped is not None and bound is not scoped:
        raise MixedStrategyError(
            f"This model was created under {bound!r} but is used inside the scope of "
            f"{scoped!r}; create, compile and train a model under one strategy."
        )
    strategy = bound or scoped
    if isinstance(strategy, DefaultStrategy):
        return None
    if strategy is not None and bound is None:
        object.__setattr__(model, _STRATEGY_ATTR, strategy)
    return strategy


def _strategy_from_variables(model: Any) -> Strategy | None:
    for variable in getattr(model, "variables", ())[:1]:
        sharding = getattr(getattr(variable, "value", None), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None:
            strategy = _strategy_by_mesh.get(mesh)
            if strategy is not None:
                object.__setattr__(model, _STRATEGY_ATTR, strategy)
            return strategy
    return None


def _check_batch_size(strategy: Strategy, name: str, arguments: dict[str, Any]) -> None:
    x = arguments.get("x")
    batch_size = arguments.get("batch_size")
    if batch_size is None and isinstance(x, (np.ndarray, jax.Array)):
        batch_size = _KERAS_DEFAULT_BATCH
    replicas = strategy.num_replicas_in_sync
    if batch_size is not None and batch_size % replicas:
        raise ValueError(
            f"Global batch size {batch_size} does not split over {replicas} replicas; use a "
            f"multiple of {replicas}, e.g. `model.{name}(..., batch_size="
            f"{max(replicas, batch_size // replicas * replicas)})`."
        )


def _prepare_arguments(strategy: Strategy, method: Callable[..., Any], name: str,
                       args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Binds ``fit``/``evaluate``/``predict`` arguments, checks them and adapts the inputs."""
    arguments = inspect.signature(method).bind_partial(None, *args, **kwargs).arguments
    arguments.pop("self", None)
    arguments.update(arguments.pop("kwargs", {}))
    if "x" in arguments:
        arguments["x"] = adapt_input(arguments["x"])
        if name == "fit" and isinstance(arguments["x"], BatchList):
            arguments["shuffle"] = False  # batches come in the order given, as from a dataset
    _check_batch_size(strategy, name, arguments)
    callbacks = arguments.get("callbacks") or ()
    callbacks = getattr(callbacks, "callbacks", callbacks)  # a CallbackList, from fit's validation
    needs_plan = any(isinstance(c, BackupAndRestore) for c in callbacks)
    if strategy.is_multi_process or needs_plan:
        arguments = shard_arguments(
            arguments, name, process_rank=strategy.process_rank,
            num_processes=strategy.num_processes, num_replicas=strategy.num_replicas_in_sync,
        )
    return arguments


def _wrap_model_method(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = model_strategy(self)
        if strategy is None:
            return original(self, *args, **kwargs)
        if name == "compile":
            object.__setattr__(self, _STRATEGY_ATTR, strategy)
        if name in _BATCHED_METHODS:
            args, kwargs = (), _prepare_arguments(strategy, original, name, args, kwargs)
        call = session.DataSession(strategy, _distribution_if_needed(strategy))
        with session.running(call):
            try:
                with warnings.catch_warnings():
                    # A run resumed mid-epoch ends that epoch's data early, on purpose.
                    warnings.filterwarnings("ignore", message="Your input ran out of data")
                    if strategy.is_multi_process:
                        return distributed.translate_collective_errors(
                            lambda: original(self, *args, **kwargs))
                    return original(self, *args, **kwargs)
            finally:
                strategy.dispatch_window.drain()

    wrapper.__stratax_wrapped__ = original  # type: ignore[attr-defined]
    return wrapper


def _bounded(step: Callable[..., Any], window: DispatchWindow) -> Callable[..., Any]:
    def bounded_step(state: Any, data: Any) -> Any:
        result = step(state, data)
        window.admit(result[0])
        return result

    return bounded_step


def _wrap_make_function(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _make_function(self: Any, step_function: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        strategy = getattr(self, _STRATEGY_ATTR, None)
        if isinstance(strategy, Strategy) and strategy.dispatch_window.size > 0:
            step_function = _bounded(step_function, strategy.dispatch_window)
        return original(self, step_function, *args, **kw)

    return _make_function


def _wrap_get_iterator(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _get_iterator(self: Any) -> Any:
        current = session.active()
        if current is None:
            return original(self)
        return current.batches(self.data_adapter)

    return _get_iterator


def _wrap_saving(original: Callable[..., Any]) -> Callable[..., Any]:
    """``save``/``save_weights``: atomic (temp file + rename); chief-only inside ``fit``.

    As in TensorFlow, saves made by callbacks during ``fit`` (``ModelCheckpoint``...) are
    written by the chief only (other workers write to a temporary folder they remove), while an
    explicit ``model.save(path)`` writes ``path`` on whichever worker calls it: the guides give
    non-chief workers their own temporary path and delete it themselves.
    """

    @functools.wraps(original)
    def save(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(filepath, (str, os.PathLike)) or kwargs.get("max_shard_size"):
            return original(self, filepath, *args, **kwargs)
        strategy = model_strategy(self)
        write = strategy is None or strategy.is_chief or session.active() is None
        with checkpoint_io.atomic_target(filepath, write=write) as target:
            return original(self, target, *args, **kwargs)

    return save


def install() -> None:
    """Wraps the Keras methods stratax extends and registers the scope hook (idempotent)."""
    global _installed
    if _installed:
        return
    context.register_scope_hook(_keras_scope)
    for name in _WRAPPED_MODEL_METHODS:
        # ``compile`` is wrapped where Keras defines it, so that Keras' check for a model with
        # its own ``compile`` (``cls.compile != Trainer.compile``) still sees the stock one.
        owner = base_trainer.Trainer if name == "compile" else keras.Model
        setattr(owner, name, _wrap_model_method(name, getattr(owner, name)))
    for name in ("save", "save_weights"):
        setattr(keras.Model, name, _wrap_saving(getattr(keras.Model, name)))
    trainer_cls = jax_trainer.JAXTrainer
    trainer_cls._make_function = _wrap_make_function(trainer_cls._make_function)
    iterator_cls = jax_trainer.JAXEpochIterator
    iterator_cls._get_iterator = _wrap_get_iterator(iterator_cls._get_iterator)
    _installed = True
