"""Nested tuples, lists and dicts of arrays <-> a JSON description plus a flat list of leaves.

Batches and step outputs cross the wire this way: the structure as JSON, the leaves as tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

_MAX_DEPTH = 32


def describe(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[Any, list[Any]]:
    """Returns ``(structure, leaves)``; anything that is not a tuple, list or dict is a leaf."""
    leaves: list[Any] = []

    def walk(node: Any, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise ValueError(f"Structure nested deeper than {_MAX_DEPTH} levels.")
        if is_leaf is not None and is_leaf(node):
            leaves.append(node)
            return "leaf"
        if isinstance(node, (tuple, list)):
            return {"t": "tuple" if isinstance(node, tuple) else "list",
                    "c": [walk(child, depth + 1) for child in node]}
        if isinstance(node, dict):
            keys = list(node)
            if not all(isinstance(k, str) for k in keys):
                raise TypeError(f"Dict keys in a batch must be strings, got {keys!r}.")
            return {"t": "dict", "k": keys, "c": [walk(node[k], depth + 1) for k in keys]}
        leaves.append(node)
        return "leaf"

    return walk(tree, 0), leaves


def build(structure: Any, leaves: Sequence[Any]) -> Any:
    """The inverse of ``describe``; raises ``ValueError`` if ``structure`` is malformed or the
    number of leaves does not match."""
    position = 0

    def walk(node: Any, depth: int) -> Any:
        nonlocal position
        if depth > _MAX_DEPTH:
            raise ValueError(f"Structure nested deeper than {_MAX_DEPTH} levels.")
        if node == "leaf":
            if position >= len(leaves):
                raise ValueError("Structure has more leaves than were sent.")
            position += 1
            return leaves[position - 1]
        if not isinstance(node, dict) or not isinstance(node.get("c"), list):
            raise ValueError(f"Malformed structure node {node!r}.")
        children = [walk(child, depth + 1) for child in node["c"]]
        kind = node.get("t")
        if kind == "tuple":
            return tuple(children)
        if kind == "list":
            return children
        if kind == "dict" and isinstance(node.get("k"), list) and len(node["k"]) == len(children):
            return dict(zip(node["k"], children, strict=False))
        raise ValueError(f"Malformed structure node {node!r}.")

    tree = walk(structure, 0)
    if position != len(leaves):
        raise ValueError(f"Structure has {position} leaves, {len(leaves)} were sent.")
    return tree
