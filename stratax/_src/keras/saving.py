"""``model.save``/``save_weights`` under a strategy: atomic, and chief-only inside ``fit``;
``load_weights`` loads the optimizer's state too.

As in TensorFlow, saves made by callbacks during ``fit`` (``ModelCheckpoint``...) are written by
the chief only (other workers write to a temporary folder they remove), while an explicit
``model.save(path)`` writes ``path`` on whichever worker calls it: the guides give non-chief
workers their own temporary path and delete it themselves. Every write goes to a temporary name
that replaces the target only when complete, so a failed save keeps the previous file.

Keras skips the optimizer's saved variables when ``load_weights`` runs before the optimizer is
built (its first ``fit``), with a warning: ``fit`` then restarts Adam's moments. TensorFlow
restores slots as they are created, so a ported program (``load_weights``, then ``fit``) expects
them back: under a strategy the optimizer of a built model is built before loading.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from stratax._src.checkpoint.files import atomic_target
from stratax._src.keras import binding, call_stack, model_parallel
from stratax._src.keras.runners.runner import runner_for


def save_method(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (``Model.save`` or ``save_weights``) made atomic and chief-only in ``fit``."""

    @functools.wraps(original)
    def save(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(filepath, (str, os.PathLike)) or kwargs.get("max_shard_size"):
            return original(self, filepath, *args, **kwargs)
        strategy = binding.model_strategy(self)
        if strategy is not None:
            runner_for(strategy).before_save(self)
        write = strategy is None or strategy.is_chief or call_stack.active() is None
        with atomic_target(filepath, write=write) as target, \
                model_parallel.whole_values(model_parallel.model_state(self),
                                            f"model.{original.__name__}"):
            return original(self, target, *args, **kwargs)

    return save


def get_weights_method(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (``Model.get_weights``) that reads state held in parts by several
    processes (model parallelism across processes) whole, when it fits."""

    @functools.wraps(original)
    def get_weights(self: Any) -> Any:
        with model_parallel.whole_values(model_parallel.model_state(self),
                                         "model.get_weights()"):
            return original(self)

    return get_weights


def load_weights_method(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (``Model.load_weights``) that builds a bound model's optimizer first, so the
    optimizer state in the file is loaded rather than skipped."""

    @functools.wraps(original)
    def load_weights(self: Any, *args: Any, **kwargs: Any) -> Any:
        strategy = binding.model_strategy(self)
        optimizer = getattr(self, "optimizer", None)
        if strategy is not None and optimizer is not None and not optimizer.built \
                and self.built and self.trainable_variables:
            with runner_for(strategy).placement_scope():
                optimizer.build(self.trainable_variables)
        return original(self, *args, **kwargs)

    return load_weights
