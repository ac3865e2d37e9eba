"""``ParameterServerStrategy.extended``: TensorFlow's ``StrategyExtended`` for parameter servers.

Variables live on the ``ps`` tasks, so here, unlike the data-parallel strategies,
``colocate_vars_with`` decides something: the variables created inside go to the parameter
server of the given one (TensorFlow's way of keeping optimizer slots next to their variable).
Only the chief runs the program past the constructor, so it checkpoints, writes summaries and
initializes (see ``strategies.extended`` for the table of every strategy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from stratax._src.parameter_server.variables import PSVariable
from stratax._src.strategies.extended import StrategyExtended, creator


class ParameterServerExtended(StrategyExtended):
    """``strategy.extended`` of a ``ParameterServerStrategy``.

    Example:
      >>> with strategy.extended.colocate_vars_with(table):              # doctest: +SKIP
      ...     slot = strategy.create_variable(np.zeros(table.shape), name="slot")
    """

    def __init__(self, strategy: Any) -> None:
        super().__init__(strategy)
        self._colocate: list[PSVariable] = []

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The parameter servers, as TensorFlow names their devices
        (``"/job:ps/replica:0/task:0/device:CPU:0"``, ...): they hold the variables."""
        return tuple(f"/job:ps/replica:0/task:{i}/device:CPU:0"
                     for i in range(len(self._strategy.cluster_resolver.cluster_spec()
                                        .job_tasks("ps"))))

    def non_slot_devices(self, var_list: Sequence[Any]) -> tuple[str, ...]:
        """The parameter server of the first of ``var_list`` by name, as TensorFlow places
        state shared by the variables there (an optimizer's step count)."""
        first = min(self._strategy.place_variables(list(var_list)), key=lambda v: v.name)
        return (self.parameter_devices[first.placements[0].ps],)

    def variable_created_in_scope(self, v: Any) -> bool:
        """Whether ``v`` is this strategy's: made by ``create_variable``, or a Keras variable
        created under its ``scope()``."""
        return (any(v is own for own in self._strategy.variables)
                or creator(v) is self._strategy)

    def colocated_ps(self) -> int | None:
        """The ps that ``colocate_vars_with`` puts new variables on, or ``None``."""
        return self._colocate[-1].placements[0].ps if self._colocate else None

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Any) -> Iterator[None]:
        """Places the variables created inside on the parameter server of
        ``colocate_with_variable`` (a ``PSVariable``, the first shard of a
        ``ShardedVariable``, or a placed Keras variable), unpartitioned, as TensorFlow's
        ``strategy.extended.colocate_vars_with`` (optimizer slots next to their variable).

        Raises:
          TypeError: ``colocate_with_variable`` is not a variable of this strategy.
        """
        target = self._strategy.place_variables(colocate_with_variable)
        if not isinstance(target, PSVariable) or not any(
                target is v for v in self._strategy.variables):
            raise TypeError(
                f"colocate_vars_with needs a variable of this strategy (created by "
                f"strategy.create_variable or a Keras variable under strategy.scope()), got "
                f"{type(colocate_with_variable).__name__}: {colocate_with_variable!r}.")
        self._colocate.append(target)
        try:
            yield
        finally:
            self._colocate.pop()

    def _place(self, value: Any, destinations: Any) -> Any:
        """Reduced values come back to the chief as numpy; the variables stay on the servers."""
        del destinations
        return value
