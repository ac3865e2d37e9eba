"""Checkpoint entries: how variables are named, matched and counted in a checkpoint. Shared by
the single-file format (``variables_file``) and the sharded one (``sharded_variables``).

Names: an entry is named by the variable's path inside its model: Keras' automatic name of the
top-level model (``sequential/``, ``functional_2/``) is dropped, because a model built in code
has it and the same model from ``keras.models.load_model`` does not. Reading matches a name
exactly, else with that leading model name stripped from either side, when one entry fits.

Iterations: each shard counts its own updates (row-sparse pushes touch only some shards), so a
checkpoint keeps one count per saved shard, by rows; a new shard takes the count of the saved
shard holding its first row.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# Keras' automatic names of a top-level model (``Sequential``, functional ``Model``); a path
# starting with one belongs to a model built in code (see the module docstring).
_AUTO_MODEL = re.compile(r"(sequential|functional|model)(_\d+)?/")


def entry_name(name: str) -> str:
    """The checkpoint name of a variable path: ``sequential_3/dense/kernel`` -> ``dense/kernel``
    (the same for the model from ``load_model``); other paths are kept."""
    return name[_AUTO_MODEL.match(name).end():] if _AUTO_MODEL.match(name) else name


def named(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` with names by ``entry_name``, except where two would then collide (variables
    of two models in one file keep their full paths)."""
    short = [entry_name(e["name"]) for e in entries]
    return [{**e, "name": s if short.count(s) == 1 else e["name"]}
            for e, s in zip(entries, short, strict=True)]


def find(entries: list[dict[str, Any]], name: str, shape: tuple[int, ...] | None,
         path: Any) -> tuple[int, dict[str, Any]]:
    """The entry named ``name``, else the one entry whose name equals it once Keras' automatic
    top-level model name is stripped from both (see ``entry_name``), checked to have ``shape``
    (unless ``None``)."""
    found = [i for i, e in enumerate(entries) if e["name"] == name]
    if not found:
        found = [i for i, e in enumerate(entries)
                 if entry_name(e["name"]) == entry_name(name)]
    if len(found) == 1:
        entry = entries[found[0]]
        if shape is not None and tuple(entry["shape"]) != shape:
            raise ValueError(f"Checkpoint {str(path)!r} has {entry['name']!r} with shape "
                             f"{tuple(entry['shape'])}, the variable {name!r} has {shape}.")
        return found[0], entry
    raise ValueError(f"Checkpoint {str(path)!r} has {'several entries for' if found else 'no'} "
                     f"variable {name!r}; it has {[e['name'] for e in entries]}.")


def join(parts: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """A variable of ``shape`` whole from its shards' ``parts`` (split along axis 0)."""
    return parts[0] if len(parts) == 1 or not shape else np.concatenate(parts, axis=0)


def iterations_at(blocks: list[list[int]], row: int) -> int:
    """The update count of the saved shard holding ``row`` (``blocks``: ``[first row, rows,
    iterations]`` per saved shard)."""
    for start, rows, iterations in blocks:
        if start <= row < start + max(rows, 1):
            return int(iterations)
    return int(blocks[0][2]) if blocks else 0

