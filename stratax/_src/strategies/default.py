"""The default strategy: what is current when no ``scope()`` is active (one replica, no scope)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax

from stratax._src.core import context
from stratax._src.strategies.base import Strategy


class DefaultStrategy(Strategy):
    """One replica on JAX's default device; ``run`` calls the function directly, as TensorFlow's.

    Returned by ``sx.get_strategy()`` outside any scope, so library code can use the strategy
    API unconditionally.
    """

    is_default = True

    def __init__(self) -> None:
        super().__init__([jax.local_devices()[0]])

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """A no-op scope: the default strategy is already current everywhere."""
        return contextlib.nullcontext(self)

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        options: Any = None,
    ) -> Any:
        """Calls ``fn(*args, **kwargs)`` directly in the default replica context."""
        del options
        with context.replica_context_scope(self.default_replica_context()):
            return fn(*args, **(kwargs or {}))

