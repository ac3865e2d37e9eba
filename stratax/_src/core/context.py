"""The strategy stack behind ``Strategy.scope()`` and the replica-context stack behind ``run``.

TensorFlow's model, kept: outside any scope the *default strategy* (one replica) is current and
code runs in its default replica context; inside ``strategy.scope()`` the program is in the
*cross-replica* context; inside ``strategy.run(fn)`` each replica runs ``fn`` in a *replica*
context. State is per thread, like TensorFlow's, so a background thread starts outside any scope.

Lower layers stay free of Keras: the Keras bridge plugs into ``scope()`` through
``register_scope_hook``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from stratax._src.core.errors import MixedStrategyError

ScopeHook = Callable[[Any], AbstractContextManager[Any]]


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.strategies: list[Any] = []
        self.replica_contexts: list[Any] = []
        # The scope `experimental_set_strategy` entered and holds open, if any.
        self.global_scope: AbstractContextManager[Any] | None = None


class _Registry:
    """Process-wide plug-ins: scope hooks and the default-strategy factory."""

    def __init__(self) -> None:
        self.scope_hooks: list[ScopeHook] = []
        self.default_strategy_factory: Callable[[], Any] | None = None
        self.default_strategy: Any = None
        self.lock = threading.Lock()


_state = _ThreadState()
_registry = _Registry()


def register_scope_hook(hook: ScopeHook) -> None:
    """Registers ``hook(strategy)``, a context manager entered inside every ``scope()``."""
    if hook not in _registry.scope_hooks:
        _registry.scope_hooks.append(hook)


def set_default_strategy_factory(factory: Callable[[], Any]) -> None:
    """Sets how the default strategy (used outside any scope) is built, lazily, once."""
    _registry.default_strategy_factory = factory


def default_strategy() -> Any:
    """The strategy that is current when no ``scope()`` is active."""
    with _registry.lock:
        if _registry.default_strategy is None:
            if _registry.default_strategy_factory is None:
                raise RuntimeError("stratax strategies are not loaded; `import stratax` first.")
            _registry.default_strategy = _registry.default_strategy_factory()
        return _registry.default_strategy


@contextlib.contextmanager
def strategy_scope(strategy: Any) -> Iterator[Any]:
    """Makes ``strategy`` current for the block (what ``Strategy.scope()`` returns)."""
    current = _state.strategies[-1] if _state.strategies else None
    if current is not None and current is not strategy:
        raise MixedStrategyError(
            f"Cannot enter the scope of {strategy!r} inside the scope of {current!r}: "
            "two strategies' scopes cannot be mixed. Leave the outer `with strategy.scope():` "
            "block first, or create everything under one strategy."
        )
    if _state.replica_contexts:
        raise RuntimeError(
            "`strategy.scope()` cannot be entered inside `strategy.run(fn)`; enter it around the "
            "code that calls `run`."
        )
    _state.strategies.append(strategy)
    try:
        with contextlib.ExitStack() as hooks:
            for hook in _registry.scope_hooks:
                hooks.enter_context(hook(strategy))
            yield strategy
    finally:
        _state.strategies.pop()


@contextlib.contextmanager
def replica_context_scope(replica_context: Any) -> Iterator[Any]:
    """Makes ``replica_context`` current while ``run`` traces the replica function."""
    _state.replica_contexts.append(replica_context)
    try:
        yield replica_context
    finally:
        _state.replica_contexts.pop()


def experimental_set_strategy(strategy: Any) -> None:
    """Makes ``strategy`` current outside any ``with`` block, or ``None`` the default again.

    TensorFlow's ``tf.distribute.experimental_set_strategy``: like entering
    ``strategy.scope()`` and never leaving it, for programs (notebooks, scripts) that do not
    want every line inside a ``with``. A later call replaces the strategy; ``None`` leaves its
    scope. Per thread, as scopes are.

    Args:
        strategy: A strategy, or ``None``.

    Raises:
        RuntimeError: Called inside a ``with strategy.scope():`` block (or ``strategy.run``).
    """
    if _state.global_scope is not None:
        held, _state.global_scope = _state.global_scope, None
        held.__exit__(None, None, None)
    if has_strategy():
        raise RuntimeError(
            f"experimental_set_strategy({strategy!r}) was called inside the scope of "
            f"{get_strategy()!r}; call it outside any `with strategy.scope():` block."
        )
    if strategy is not None:
        scope = strategy.scope()
        scope.__enter__()
        _state.global_scope = scope


def get_strategy() -> Any:
    """Returns the current strategy: the innermost ``scope()``'s, else the default strategy.

    Inside ``run`` it is the strategy running the replica function.
    """
    if _state.replica_contexts:
        return _state.replica_contexts[-1].strategy
    if _state.strategies:
        return _state.strategies[-1]
    return default_strategy()


def has_strategy() -> bool:
    """True inside a non-default strategy's ``scope()`` or ``run``."""
    return bool(_state.strategies) or bool(_state.replica_contexts)


def in_cross_replica_context() -> bool:
    """True inside ``strategy.scope()`` but outside ``strategy.run`` (TensorFlow's meaning)."""
    return bool(_state.strategies) and not _state.replica_contexts


def in_replica_function() -> bool:
    """True while ``strategy.run`` traces a replica function."""
    return bool(_state.replica_contexts)


def get_replica_context() -> Any:
    """Returns the current ``ReplicaContext``, or ``None`` in the cross-replica context.

    Outside any scope it is the default strategy's replica context (one replica, id 0).
    """
    if _state.replica_contexts:
        return _state.replica_contexts[-1]
    if _state.strategies:
        return None
    return default_strategy().default_replica_context()


def current_scope_strategy() -> Any:
    """The innermost strategy whose ``scope()`` is active, or ``None`` (no default)."""
    return _state.strategies[-1] if _state.strategies else None
