"""The variables format: one ``.npz`` file of whole variables with their optimizer state.

Raw arrays named ``value/<name>`` and ``slot/<slot>/<name>``, plus a JSON header listing each
variable's name, shape, dtype, optimizer (its key: the Keras optimizer's config, as the
parameter servers apply it) and update counts by rows; no pickle. Written atomically. Nothing
in it depends on the placement, so every strategy reads it: ``ParameterServerStrategy``'s
``save_checkpoint``/``restore_checkpoint`` (``parameter_server/server_checkpoints.py``) and
``sx.checkpoint.save_variables``/``load_variables`` (``keras/checkpoint_variables.py``).
``read`` also reads a sharded directory (``sharded_variables``), each array when it is used.

Names: an entry is named by the variable's path inside its model (``entries.named``).
Iterations: each shard counts its own updates, so the file keeps one count per saved shard, by
rows (``entries.iterations_at``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from stratax._src.checkpoint import sharded_variables
from stratax._src.checkpoint.entries import named
from stratax._src.checkpoint.files import HEADER, write_npz

# Version 2 names each array by its variable (``value/<name>``, ``slot/<slot>/<name>``);
# version 1 (still read) numbered them by entry (``value/<i>``, ``slot/<i>/<slot>``).
FORMAT, VERSION = "stratax-variables", 2


def write(path: str | os.PathLike, entries: list[dict[str, Any]],
           arrays: dict[str, np.ndarray]) -> None:
    """Writes ``entries`` (name, shape, dtype, optimizer key, slot names and update counts of
    each variable) and ``arrays`` (by entry number: ``value/<i>``, ``slot/<i>/<slot>``) to the
    ``.npz`` file ``path``, atomically."""
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"Checkpoint path {str(path)!r} must end with '.npz'.")
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = named(entries)
    write_npz(path, {"format": FORMAT, "version": VERSION, "variables": entries},
              {_array_key(key, entries): value for key, value in arrays.items()})


def _array_key(key: str, entries: list[dict[str, Any]], named: bool = True) -> str:
    """An array's key in the file (``value/<name>``, ``slot/<slot>/<name>``) from its key by
    entry number (``value/<i>``, ``slot/<i>/<slot>``), or back with ``named=False``."""
    kind, rest = key.split("/", 1)
    if named:
        index, _, slot = rest.partition("/")
        name = entries[int(index)]["name"]
        return f"value/{name}" if kind == "value" else f"slot/{slot}/{name}"
    for index, entry in enumerate(entries):
        if kind == "value" and rest == entry["name"]:
            return f"value/{index}"
        for slot in entry["slots"]:
            if kind == "slot" and rest == f"{slot}/{entry['name']}":
                return f"slot/{index}/{slot}"
    raise ValueError(f"Checkpoint array {key!r} belongs to no variable of its header.")


def read(path: str | os.PathLike) -> tuple[list[dict[str, Any]], Any]:
    """The entries of the checkpoint ``path`` and its arrays by entry number (``value/<i>``,
    ``slot/<i>/<slot>``): a dict for a ``.npz`` file, a reader for a sharded directory."""
    if sharded_variables.is_sharded(path):
        version, entries = sharded_variables.read_manifest(path)
        return entries, _ShardedArrays(version, entries)
    with np.load(path, allow_pickle=False) as npz:
        data = {k: np.array(npz[k]) for k in npz.files}
    header = json.loads(data.pop(HEADER).tobytes())
    if header.get("format") != FORMAT or header.get("version") not in (1, VERSION):
        raise ValueError(f"{str(path)!r} is not a stratax variables checkpoint (version 1 "
                         f"or {VERSION}); its header says {header.get('format')!r} "
                         f"{header.get('version')!r}.")
    entries = header["variables"]
    if header["version"] == 1:
        return entries, data
    return entries, {_array_key(key, entries, named=False): value for key, value in data.items()}


class _ShardedArrays:
    """``data[key]`` of ``_read`` for a sharded checkpoint: each array assembled from its parts
    when asked for, from the version the manifest was read from (read once)."""

    def __init__(self, version: Path, entries: list[dict[str, Any]]) -> None:
        self._version, self._entries = version, entries

    def __getitem__(self, key: str) -> np.ndarray:
        kind, index, *slot = key.split("/")
        return sharded_variables.load_whole(self._version, self._entries[int(index)],
                                             slot[0] if kind == "slot" else None)
