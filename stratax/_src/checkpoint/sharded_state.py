"""Checkpoints of arrays sharded over processes: each process writes its own shards.

A ``jax.Array`` split over the devices of several processes (model parallelism across hosts)
is never whole in any process, so no single writer can save it. Here every process copies the
shards it holds (one copy of each distinct shard in the whole job: the replica with
``replica_id == 0``) and writes them as plain ``.npy`` files with a JSON index, into one staging
directory shared by all; process 0 waits until every process reports its files durable
(through the ``jax.distributed`` coordination service's key-value store, not a device
collective, so that writes can run off the training thread), then commits the version as
``versions`` commits one written by a single process. A version is therefore visible only
when every shard of it is on disk.

Reading never needs the layout that wrote: an entry knows each saved piece's offset, and
:meth:`Entry.read` assembles any region from the pieces it overlaps (memory-mapped, so a
process reads only the bytes of its own shards). :meth:`Entry.place` builds a ``jax.Array`` on
any sharding from those regions (resharding on read); ``np.asarray(entry)`` gives it whole, for
a process that holds the array whole (a restore onto fewer processes, or one).

``docs/design/checkpoints.md`` says why this is not Orbax.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np

from stratax._src import seam
from stratax._src.checkpoint.files import fsync_directory

try:
    import fcntl
except ImportError:  # not POSIX: staging directories are not locked
    fcntl = None  # type: ignore[assignment]

_KEY = "stratax/checkpoint"
# How long process 0 waits for the others' shards, and they for its commit. A peer that dies
# ends the whole job through the coordination service well before this.
_PEER_TIMEOUT_S = 1800


def is_sharded(value: Any) -> bool:
    """True for a ``jax.Array`` that no single process holds whole (not fully addressable and
    not replicated on every device): the arrays that need per-process writes."""
    return (isinstance(value, jax.Array) and not value.is_fully_addressable
            and not value.is_fully_replicated)


@dataclass
class Parts:
    """This process's share of a sharded array, copied to host memory: the distinct shards it
    holds, each with the offset of its first element in the whole array."""

    shape: tuple[int, ...]
    dtype: str
    pieces: list[tuple[tuple[int, ...], np.ndarray]] = field(default_factory=list)


def local_parts(value: jax.Array) -> Parts:
    """Copies ``value``'s shards held here (one per distinct index in the job) to host memory;
    a copy, since the next step may donate the device buffers."""
    parts = Parts(tuple(value.shape), np.dtype(value.dtype).name)
    for shard in value.addressable_shards:
        if shard.replica_id != 0:
            continue
        start = tuple(s.indices(n)[0] for s, n in zip(shard.index, value.shape, strict=True))
        parts.pieces.append((start, np.array(shard.data, copy=True)))
    return parts


def _run_id(client: Any) -> str:
    """A name all processes of this ``jax.distributed`` job share and no earlier job had (its
    staging directories then never meet a dead job's)."""
    cached = _run_ids.get(id(client))
    if cached is None:
        key = f"{_KEY}/run"
        if jax.process_index() == 0:
            client.key_value_set(key, uuid.uuid4().hex[:12])
        cached = client.blocking_key_value_get(key, _PEER_TIMEOUT_S * 1000)
        _run_ids[id(client)] = cached
    return cached


_run_ids: dict[int, str] = {}
_saves_started = [0]  # per process; every process saves in the same order


def next_tag() -> str:
    """The name of the next save, the same in every process: call it where every process
    saves in the same order (the training thread), not in a background writer."""
    client = seam.distributed_client()
    if client is None:
        raise RuntimeError("Arrays sharded over processes need jax.distributed; this process "
                           "has no coordination-service client.")
    tag = f"{_run_id(client)}-{_saves_started[0]}"
    _saves_started[0] += 1
    return tag


def stage(root: Path, parts: Mapping[str, Parts], tag: str) -> tuple[Path, int | None]:
    """Writes this process's pieces of ``parts`` into the staging directory of save ``tag``
    (shared by all processes), each file flushed to disk, then its index; returns the
    directory and a descriptor holding its shared lock (close it once the version is
    committed: until then no clean-up removes the directory)."""
    client = seam.distributed_client()
    staging = root / f".staging-sharded-{tag}"
    process = jax.process_index()
    key = f"{_KEY}/{tag}/written/{process}"
    held = None
    try:
        staging.mkdir(parents=True, exist_ok=True)
        held = _hold_shared(staging)
        _write_pieces(staging, process, parts)
    except BaseException as err:  # process 0 names it instead of waiting for this process
        if held is not None:
            os.close(held)
        client.key_value_set(key, f"{type(err).__name__}: {err}")
        raise
    client.key_value_set(key, "ok")
    return staging, held


def _write_pieces(staging: Path, process: int, parts: Mapping[str, Parts]) -> None:
    """Writes ``parts``' pieces as ``p<process>-<i>.npy`` and their index ``p<process>.json``
    into ``staging``, each flushed to disk, then the directory's entries."""
    index = []
    for name, part in parts.items():
        for start, data in part.pieces:
            file = f"p{process}-{len(index)}.npy"
            with open(staging / file, "wb") as f:
                np.save(f, data, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
            index.append({"name": name, "file": file, "start": list(start),
                          "shape": list(data.shape)})
    with open(staging / f"p{process}.json", "w") as f:
        json.dump(index, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_directory(staging)


def wait_for_peers(tag: str, where: Path) -> None:
    """On process 0: returns once every process has written its shards of save ``tag``.

    Raises:
      TimeoutError: a process did not report within the timeout; the message names it.
      OSError: a process failed to write its shards; the message quotes its error.
    """
    client = seam.distributed_client()
    for process in range(jax.process_count()):
        try:
            outcome = client.blocking_key_value_get(f"{_KEY}/{tag}/written/{process}",
                                                    _PEER_TIMEOUT_S * 1000)
        except Exception as err:  # XlaRuntimeError: DEADLINE_EXCEEDED or the service is gone
            raise TimeoutError(
                f"Process {process} did not write its shards of the checkpoint in {where} "
                f"within {_PEER_TIMEOUT_S} s ({err}); check that process's log.") from err
        if outcome != "ok":
            raise OSError(f"Process {process} could not write its shards of the checkpoint "
                          f"in {where}: {outcome}")


def announce(tag: str, outcome: str) -> None:
    """On process 0: tells the other processes how save ``tag`` ended (``"ok"`` or an
    error's text)."""
    seam.distributed_client().key_value_set(f"{_KEY}/{tag}/committed", outcome)


def wait_for_commit(tag: str, where: Path) -> None:
    """On a process other than 0: returns once process 0 committed save ``tag``.

    Raises:
      OSError: process 0 failed to commit it (its error is quoted), or did not answer.
    """
    try:
        outcome = seam.distributed_client().blocking_key_value_get(
            f"{_KEY}/{tag}/committed", _PEER_TIMEOUT_S * 1000)
    except Exception as err:
        raise OSError(f"Process 0 did not commit the checkpoint in {where} within "
                      f"{_PEER_TIMEOUT_S} s ({err}); check its log.") from err
    if outcome != "ok":
        raise OSError(f"Process 0 could not commit the checkpoint in {where}: {outcome}")


def _hold_shared(path: Path) -> int | None:
    """A descriptor of directory ``path`` holding a shared lock: ``files.remove_stale`` (which
    needs the exclusive lock) leaves it alone while any process writes into it."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


class Entry:
    """One saved sharded array, read from its pieces in any layout.

    ``shape``, ``dtype`` and ``ndim`` are the whole array's; ``np.asarray(entry)`` reads it
    whole; :meth:`read` reads a region; :meth:`place` builds it on a sharding.
    """

    def __init__(self, shape: Iterable[int], dtype: str,
                 pieces: list[tuple[Path, tuple[int, ...], tuple[int, ...]]]) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(jax.numpy.dtype(dtype))
        self.ndim = len(self.shape)
        self._pieces = pieces
        covered = sum(int(np.prod(size)) for _, _, size in pieces)
        if covered != int(np.prod(self.shape)):
            raise ValueError(f"The saved pieces of an array of shape {self.shape} cover "
                             f"{covered} elements, not {int(np.prod(self.shape))}: the "
                             "checkpoint is incomplete. Restore an earlier version.")

    def read(self, index: tuple[slice, ...] = ()) -> np.ndarray:
        """The region ``index`` (a tuple of slices with step 1, as JAX's shard indices are) of
        the whole array, assembled from the pieces it overlaps."""
        index = tuple(index) + (slice(None),) * (self.ndim - len(index))
        bounds = [s.indices(n)[:2] for s, n in zip(index, self.shape, strict=True)]
        out = np.empty([hi - lo for lo, hi in bounds], self.dtype)
        for path, start, size in self._pieces:
            lows = [max(lo, s) for (lo, _), s in zip(bounds, start, strict=True)]
            highs = [min(hi, s + n) for (_, hi), s, n in zip(bounds, start, size, strict=True)]
            if any(lo >= hi for lo, hi in zip(lows, highs, strict=True)):
                continue
            data = np.load(path, mmap_mode="r", allow_pickle=False)
            source = tuple(slice(lo - s, hi - s) for lo, hi, s in zip(lows, highs, start,
                                                                    strict=True))
            target = tuple(slice(lo - b, hi - b) for lo, hi, (b, _) in zip(lows, highs, bounds,
                                                                          strict=True))
            out[target] = data[source].view(self.dtype) if data.dtype != self.dtype \
                else data[source]
            del data
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.read()
        return whole if dtype is None else whole.astype(dtype)

    def place(self, sharding: jax.sharding.Sharding) -> jax.Array:
        """The array on ``sharding``, each process reading only the regions its devices
        hold."""
        return jax.make_array_from_callback(self.shape, sharding, self.read)


def read_entries(version: Path, sharded: Mapping[str, Mapping[str, Any]],
                 processes: int) -> dict[str, Entry]:
    """The sharded entries of checkpoint ``version`` (``sharded``: name -> shape and dtype,
    from its metadata), written by ``processes`` processes."""
    pieces: dict[str, list[tuple[Path, tuple[int, ...], tuple[int, ...]]]] = {
        name: [] for name in sharded}
    for process in range(processes):
        for item in json.loads((version / f"p{process}.json").read_text()):
            pieces[item["name"]].append((version / item["file"], tuple(item["start"]),
                                         tuple(item["shape"])))
    return {name: Entry(info["shape"], info["dtype"], pieces[name])
            for name, info in sharded.items()}


def value_for(variable: Any, value: Any) -> Any:
    """``value`` (a NumPy array or an :class:`Entry`) in the form ``variable`` takes it: on
    the variable's own sharding when the variable is sharded over processes (each process
    reads only its shards), else whole."""
    current = seam.held_value(variable)
    if is_sharded(current):
        if isinstance(value, Entry):
            return value.place(current.sharding)
        return jax.make_array_from_callback(tuple(value.shape), current.sharding,
                                            lambda index: np.asarray(value[index]))
    return np.asarray(value)
