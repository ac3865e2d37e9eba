"""What the parameter servers report about a strategy's variables: placement, update counts,
the ledger of applied steps and per-shard counters (``strategy.shard_stats`` and its kin)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stratax._src.parameter_server.transport.ps_client import PSClients
from stratax._src.parameter_server.variables import PSVariable, describe_table


def describe(variables: Sequence[PSVariable], addresses: Sequence[str]) -> str:
    """A table: each variable's shards, the ps holding them (with address) and bytes."""
    return describe_table(variables, addresses)


def shard_stats(ps: PSClients, variable: PSVariable) -> list[dict[str, Any]]:
    """Per shard of ``variable``, its ps' counters: ``iterations``, ``applied_steps``,
    ``duplicates``, ``whole_pulls``, ``rows_pulled`` (the row-sparse path), ``bytes``,
    ``apply_seconds``."""
    return [ps.clients[p.ps].call("stats", {"names": [p.key]}).meta["stats"][p.key]
            for p in variable.placements]


def optimizer_iterations(ps: PSClients, variable: PSVariable) -> list[int]:
    """Updates applied to each shard of ``variable`` (exact; one per applied step id)."""
    return [int(stats["iterations"]) for stats in shard_stats(ps, variable)]


def applied_steps(ps: PSClients, variable: PSVariable) -> list[list[str]]:
    """Per shard of ``variable``, the ids (``"c<closure>:<step>"``) of the steps applied to
    it, sorted: the parameter servers' ledger, to check that no step was applied twice (their
    count equals ``optimizer_iterations``) or lost."""
    return [ps.clients[p.ps].call("ledger", {"names": [p.key]}).meta["ledger"][p.key]
            for p in variable.placements]
