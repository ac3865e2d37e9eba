"""Checkpoint entries: how variables are named, matched and counted in a checkpoint, and the
one way the chief calls every ps with tensors. Shared by the single-file format
(``checkpoint``) and the sharded one (``sharded_checkpoint``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np


def call(method: str, meta: dict[str, Any], tensors: Sequence[np.ndarray] = ()) -> Any:
    """A ``PSClients.each`` call of ``method`` (streamed: shards may be large)."""
    return lambda client: client.call(method, meta, list(tensors), stream=True)


# Keras' automatic names of a top-level model (``Sequential``, functional ``Model``); a path
# starting with one belongs to a model built in code (see ``checkpoint``'s docstring).
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
    return parts[0] if len(parts) == 1 or not shape else np.concatenate(parts, axis=0)


def iterations_at(blocks: list[list[int]], row: int) -> int:
    for start, rows, iterations in blocks:
        if start <= row < start + max(rows, 1):
            return int(iterations)
    return int(blocks[0][2]) if blocks else 0

