"""``fit``'s epoch logs taken from the last train step's own logs when they are the same values.

At the end of every epoch Keras asks the model for its metric results again
(``Trainer._get_metrics_result_or_logs``): eagerly, a few small programs per metric, and between
processes each of them runs on arrays that span the processes, on the critical path between two
epochs (docs/design/performance.md has the cost). Keras' own train step has already computed
exactly those results, from the metric values it returned, and Keras re-asks only for steps of
its users' making and for steps still running out of order (neither happens here: every step of
a group runs in order before the next). So when the step is Keras' own and the model's metric
variables still hold the very arrays the last step returned (no callback changed them since),
the epoch's logs are the step's, converted as Keras converts its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras

# The methods whose stock versions make a train step's logs ``get_metrics_result()`` of the
# metric values it returns.
_KERAS_OWN = ("train_step", "compute_metrics", "get_metrics_result")


class StateLogs(dict):
    """A train step's logs, with the metric values (arrays) whose results they are."""

    def __init__(self, logs: dict[str, Any], metrics_values: Any) -> None:
        super().__init__(logs)
        self.metrics_values = tuple(metrics_values)

    def describe(self, model: Any) -> bool:
        """Whether these logs are the results of ``model``'s metric variables as they are now."""
        variables = model.metrics_variables
        return len(variables) == len(self.metrics_values) and all(
            variable.value is value
            for variable, value in zip(variables, self.metrics_values, strict=True))


def overridden(model: Any, names: tuple[str, ...]) -> str | None:
    """The first of the ``keras.Model`` methods ``names`` that ``model``'s class overrides."""
    return next((name for name in names
                 if getattr(type(model), name) is not getattr(keras.Model, name)), None)


def keeps_keras_logs(model: Any) -> bool:
    """Whether ``model``'s train step logs are Keras' own metric results of its final state."""
    return overridden(model, _KERAS_OWN) is None


def _python_value(value: Any) -> Any:
    """``value`` as Keras' ``pythonify_logs`` leaves it: a float where it converts."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def metrics_result_or_logs_method(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (Keras' ``Trainer._get_metrics_result_or_logs``), answered from the step's
    logs where they are the results it would compute."""

    @functools.wraps(original)
    def _get_metrics_result_or_logs(self: Any, logs: Any) -> Any:
        if isinstance(logs, StateLogs) and logs.describe(self):
            return {name: _python_value(value) for name, value in logs.items()}
        return original(self, logs)

    return _get_metrics_result_or_logs
