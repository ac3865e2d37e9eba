"""What the parameter servers report about a strategy's variables: placement, update counts,
the ledger of applied steps and per-shard counters (``strategy.shard_stats`` and its kin).

``ServerStats`` gives ``ParameterServerStrategy`` these methods; it reads the strategy's
servers (``_ps``, ``_ps_addresses``) and variables (``_store``).
"""

from __future__ import annotations

from typing import Any

from stratax._src.parameter_server.variables import PSVariable, describe_table


class ServerStats:
    """``ParameterServerStrategy``'s methods that ask its parameter servers for counters."""

    _ps: Any
    _ps_addresses: Any
    _store: Any

    def describe_variables(self) -> str:
        """A table: each variable's shards, the ps holding them (with address) and bytes."""
        return describe_table(self._store.variables, self._ps_addresses)

    def optimizer_iterations(self, variable: PSVariable) -> list[int]:
        """Updates applied to each shard of ``variable`` (exact; one per applied step id)."""
        return [int(stats["iterations"]) for stats in self.shard_stats(variable)]

    def shard_stats(self, variable: Any) -> list[dict[str, Any]]:
        """Per shard of ``variable`` (a ``PSVariable`` or a placed Keras variable), its ps'
        counters: ``iterations``, ``applied_steps``, ``duplicates``, ``whole_pulls``,
        ``rows_pulled`` (the row-sparse path), ``bytes``, ``apply_seconds``."""
        placed = self._store.on_ps(variable)
        return [self._ps.clients[p.ps].call("stats", {"names": [p.key]}).meta["stats"][p.key]
                for p in placed.placements]

    def applied_steps(self, variable: PSVariable) -> list[list[str]]:
        """Per shard of ``variable``, the ids (``"c<closure>:<step>"``) of the steps applied to
        it, sorted: the parameter servers' ledger, to check that no step was applied twice
        (their count equals ``optimizer_iterations``) or lost."""
        return [self._ps.clients[p.ps].call("ledger", {"names": [p.key]}).meta["ledger"][p.key]
                for p in variable.placements]
