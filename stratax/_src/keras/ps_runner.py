"""Keras under ``ParameterServerStrategy``: variables in ``scope()``, saves, and ``fit``'s limits.

Keras variables created under the strategy's scope stay ordinary Keras variables on the chief;
the strategy moves them to the parameter servers on first use in a scheduled step, and
``before_save`` copies the trained values back before ``model.save``/``save_weights``. The
Keras training loop under this strategy (``model.fit``, ``evaluate``, ``predict`` scheduling
steps on the workers) is not built yet: those calls fail at once with a message that points to
the custom loop with ``ClusterCoordinator``, which is.
"""

from __future__ import annotations

from typing import Any

from stratax._src.keras.runner import KerasRunner


class ParameterServerRunner(KerasRunner):
    """Keras calls of a model under ``ParameterServerStrategy`` (see the module docstring)."""

    def prepare(self, method: str, arguments: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError(
            f"model.{method} under ParameterServerStrategy is not available in stratax yet. "
            "Train with a custom loop: `coordinator = sx.coordinator.ClusterCoordinator("
            "strategy)`, then `coordinator.schedule(step_fn, args=(iterator,))` and "
            "`coordinator.join()` (docs/parameter_server.md), and call "
            "`strategy.refresh_keras_variables()` to read the trained weights."
        )

    def before_save(self, model: Any) -> None:
        self.strategy.refresh_keras_variables()
