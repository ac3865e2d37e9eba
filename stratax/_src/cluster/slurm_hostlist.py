"""Parsers for Slurm's compressed node lists and tasks-per-node strings (no ``scontrol`` call).

``SLURM_JOB_NODELIST="node[01-03,07],gpu-a[1-2]"`` names node01, node02, node03, node07,
gpu-a1, gpu-a2; ``SLURM_TASKS_PER_NODE="2(x3),1"`` means 2, 2, 2 and 1 tasks on those nodes in
order. Parsing them here keeps the resolver free of subprocesses, so it works in containers
without the Slurm client tools and is testable with a patched environment.
"""

from __future__ import annotations

import itertools
import re

_RANGE = re.compile(r"^(?P<lo>[0-9]+)(?:-(?P<hi>[0-9]+))?$")
_TASKS = re.compile(r"^(?P<count>[0-9]+)(?:\(x(?P<repeat>[0-9]+)\))?$")


def _split_top_level(hostlist: str) -> list[str]:
    """Splits at commas that are not inside brackets, checking that brackets balance."""
    items: list[str] = []
    depth = 0
    current = ""
    for position, char in enumerate(hostlist):
        if char == "[":
            if depth:
                raise ValueError(
                    f"Invalid Slurm node list {hostlist!r}: nested '[' at character {position}; "
                    "ranges look like 'node[01-04,07]'."
                )
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(
                    f"Invalid Slurm node list {hostlist!r}: ']' without '[' at character "
                    f"{position}."
                )
            depth = 0
        elif char == "," and not depth:
            items.append(current)
            current = ""
            continue
        current += char
    if depth:
        raise ValueError(f"Invalid Slurm node list {hostlist!r}: '[' is never closed.")
    items.append(current)
    for item in items:
        if not item.strip():
            raise ValueError(
                f"Invalid Slurm node list {hostlist!r}: it has an empty entry (two commas in a "
                "row or a trailing comma)."
            )
    return [item.strip() for item in items]


def _expand_ranges(ranges: str, hostlist: str) -> list[str]:
    """Expands the inside of one bracket, e.g. ``"01-03,07"``, keeping zero padding."""
    values: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ValueError(
                f"Invalid Slurm node list {hostlist!r}: range {part!r} is not 'N' or 'N-M' "
                "with decimal numbers."
            )
        lo_text = match.group("lo")
        hi_text = match.group("hi") or lo_text
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(
                f"Invalid Slurm node list {hostlist!r}: range {part!r} goes down ({lo} > {hi})."
            )
        width = len(lo_text)
        values.extend(str(number).zfill(width) for number in range(lo, hi + 1))
    return values


def _expand_item(item: str, hostlist: str) -> list[str]:
    """Expands one host pattern; several bracket groups give their cartesian product."""
    pieces: list[list[str]] = []
    for literal, ranges in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", item):
        if literal:
            pieces.append([literal])
        if ranges:
            pieces.append(_expand_ranges(ranges, hostlist))
    if "[]" in item:
        raise ValueError(f"Invalid Slurm node list {hostlist!r}: empty range '[]' in {item!r}.")
    return ["".join(parts) for parts in itertools.product(*pieces)]


def expand_hostlist(hostlist: str) -> list[str]:
    """Expands a Slurm node list such as ``"node[01-04,07],gpu-a[1-2]"`` to host names.

    Order is preserved and nothing is deduplicated; zero padding of the lower bound is kept
    (``"n[08-10]"`` gives ``n08, n09, n10``).

    Raises:
      ValueError: If the list is empty or malformed (unbalanced or nested brackets, empty
        entries, non-numeric or descending ranges).
    """
    if not hostlist or not hostlist.strip():
        raise ValueError("The Slurm node list is empty; expected e.g. 'node[01-04],gpu7'.")
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        hosts.extend(_expand_item(item, hostlist))
    return hosts


def expand_tasks_per_node(tasks_per_node: str) -> list[int]:
    """Expands a Slurm tasks-per-node string such as ``"2(x3),1"`` to ``[2, 2, 2, 1]``.

    Raises:
      ValueError: If an entry is not ``N`` or ``N(xK)`` with ``N, K >= 1``.
    """
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = _TASKS.match(part.strip())
        if match is None:
            raise ValueError(
                f"Invalid Slurm tasks-per-node value {tasks_per_node!r}: entry {part!r} is not "
                "'N' or 'N(xK)' (e.g. '2(x3),1')."
            )
        count = int(match.group("count"))
        repeat = int(match.group("repeat") or 1)
        if count < 1 or repeat < 1:
            raise ValueError(
                f"Invalid Slurm tasks-per-node value {tasks_per_node!r}: entry {part!r} has a "
                "zero count; every node runs at least one task."
            )
        counts.extend([count] * repeat)
    return counts
