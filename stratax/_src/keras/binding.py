"""Which strategy a Keras model belongs to.

As in TensorFlow, a model remembers the strategy it was built or compiled under, so
``fit``/``evaluate``/``predict`` called *outside* ``scope()`` (as the guides do) still run
distributed; a model with no strategy runs exactly as plain Keras.
"""

from __future__ import annotations

import weakref
from typing import Any

from stratax._src.core import context
from stratax._src.core.errors import MixedStrategyError

_STRATEGY_ATTR = "_stratax_strategy"
_strategy_by_mesh: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()


def remember_mesh(strategy: Any) -> None:
    """Lets a model whose variables live on ``strategy``'s mesh find the strategy."""
    mesh = getattr(strategy, "mesh", None)
    if mesh is not None:
        _strategy_by_mesh[mesh] = strategy


def bind(model: Any, strategy: Any) -> None:
    """Records ``strategy`` as ``model``'s (``compile`` under a scope does this)."""
    object.__setattr__(model, _STRATEGY_ATTR, strategy)


def model_strategy(model: Any) -> Any:
    """The strategy ``model`` belongs to: the one it was compiled or built under, else the scope's.

    Returns ``None`` for a model of no strategy (or of the default strategy).

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
    if strategy is None or getattr(strategy, "is_default", False):
        return None
    if bound is None:
        bind(model, strategy)
    return strategy


def _strategy_from_variables(model: Any) -> Any:
    for variable in getattr(model, "variables", ())[:1]:
        sharding = getattr(getattr(variable, "value", None), "sharding", None)
        mesh = getattr(sharding, "mesh", None)
        if mesh is not None:
            strategy = _strategy_by_mesh.get(mesh)
            if strategy is not None:
                bind(model, strategy)
            return strategy
    return None
