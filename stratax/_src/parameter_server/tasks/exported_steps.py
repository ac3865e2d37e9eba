"""A worker's exported steps (``worker``'s docstring tells the run): the programs the chief
registered, what a run reads (dense variables whole, the distinct rows of its tables), running
the compiled step, and its gradients as pushes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax import export as jax_export

from stratax._src.parameter_server.transport import wire
from stratax._src.parameter_server.transport.ps_client import Push


class Program:
    """A step the chief registered: its exported step and id programs, compiled here, and the
    variables it reads."""

    def __init__(self, meta: dict[str, Any], step: bytes, ids: bytes | None) -> None:
        self.meta = meta
        self.step = jax.jit(jax_export.deserialize(bytearray(step)).call)
        self.ids = jax.jit(jax_export.deserialize(bytearray(ids)).call) if ids else None
        self.variables = {v["name"]: v for v in meta["variables"]}
        # Hybrid mode: the variables this worker's replica holds (see ``resident``).
        self.resident = frame_names(meta.get("resident", []))


@dataclasses.dataclass
class Reads:
    """What one run of a step reads from the parameter servers (``reads_of``)."""

    variables: list[dict[str, Any]]
    rows: list[np.ndarray | None]          # per variable: None (whole) or distinct rows
    uniques: list[np.ndarray]              # per table read with read_rows
    positions: list[np.ndarray]            # per table: index of each id in its distinct rows


def reads_of(program: Program, leaves: list[np.ndarray]) -> Reads:
    """What a step reads: its dense variables whole and, for each table read with
    ``read_rows``, the distinct rows its batch looks up (from the id program)."""
    meta = program.meta
    positions, uniques = [], []
    if program.ids is not None:
        ids_list = [np.asarray(x) for x in program.ids(leaves)]
        for name, ids in zip(meta["sparse"], ids_list, strict=False):
            var = program.variables[name]
            flat = ids.reshape(-1).astype(np.int64)
            if flat.size and (flat.min() < 0 or flat.max() >= var["shape"][0]):
                bad = flat[(flat < 0) | (flat >= var["shape"][0])][0]
                raise IndexError(f"Embedding id {bad} is outside 0..{var['shape'][0] - 1} "
                                 f"of {name!r}.")
            unique, inverse = np.unique(flat, return_inverse=True)
            uniques.append(unique)
            positions.append(inverse.reshape(ids.shape).astype(np.int32))
    variables = [program.variables[n] for n in [*meta["dense"], *meta["sparse"]]]
    return Reads(variables, [None] * len(meta["dense"]) + uniques, uniques, positions)


def compute(program: Program, reads: Reads, values: list[np.ndarray],
            leaves: list[np.ndarray],
            local_values: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Runs the compiled step on the pulled values and this worker's copies of its
    per-worker variables; returns (gradients and new values, outputs)."""
    num_dense = len(program.meta["dense"])
    rows = []
    for position, row_values in zip(reads.positions, values[num_dense:], strict=False):
        padded = np.zeros((max(position.size, 1), *row_values.shape[1:]), row_values.dtype)
        padded[:row_values.shape[0]] = row_values
        rows.append(padded)
    grads, outputs = program.step(values[:num_dense], rows, reads.positions, leaves,
                                  local_values)
    return [np.asarray(g) for g in grads], [np.asarray(o) for o in outputs]


def pushes_of(program: Program, reads: Reads, grads: list[np.ndarray]) -> list[Push]:
    """The step's gradients as pushes: row-sparse (distinct rows, their gradients) for
    tables read with ``read_rows``, whole otherwise."""
    pushes = []
    for push, grad in zip(program.meta["pushes"], grads, strict=False):
        var = program.variables[push["var"]]
        if push["sparse"] >= 0:
            unique = reads.uniques[push["sparse"]]
            pushes.append((var, unique, grad[:unique.size]))
        else:
            pushes.append((var, None, grad))
    return pushes


def frame_names(names: Any) -> frozenset[str]:
    """The names a frame's ``resident`` field lists, as a set."""
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise wire.WireError(f"Field 'resident' must list variable names, got {names!r}.")
    return frozenset(names)
