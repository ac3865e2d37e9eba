"""Parameter-server snapshots: a ps writes its shards every N pushes and reloads them on restart.

A snapshot holds, per shard, the value, the optimizer (its spec, slots and iterations) and the
ledger of applied step ids, and the digest of the chief session it belongs to (never the id: the
id is the chief's capability, and a file outlives the run), in one ``.npz`` file (raw arrays
named ``value/<shard>`` and ``slot/<slot>/<shard>``, plus a JSON header; no pickle).
It is written atomically (``checkpoint.files.write_npz``: a temp file, flushed to disk, then
renamed over ``ps<i>.npz``), so a ps killed while writing leaves the previous snapshot intact;
its temp file (``.ps<i>.npz.tmp-*``, locked while written) is removed when the ps starts again.

Consistency: while a snapshot is taken no push is applied (pushes wait for it), so every
shard's value, slots and ledger agree. A ps restarted at its address with the same directory
loads the file before it listens; pushes retried by the workers (see ``recovery``) are then
applied unless the restored ledger has them. What is lost: the pushes applied after the last
completed snapshot, at most ``every`` (the coordinator does not re-run them). Asynchronous
mode only: a synchronous step's partial sum is not in the snapshot (a warning says so).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from stratax._src.checkpoint.files import HEADER, remove_stale_temporaries, write_npz
from stratax._src.core import env
from stratax._src.core.config import config
from stratax._src.parameter_server.tasks import ownership
from stratax._src.parameter_server.tasks.optimizers import ShardOptimizer
from stratax._src.parameter_server.transport import wire

logger = logging.getLogger(__name__)
# Version 2 names each array by its shard (``value/<shard>``, ``slot/<slot>/<shard>``, e.g.
# ``value/embedding/part_1``); version 1 (still read) numbered them (``value/<i>``).
VERSION = 2


class Snapshots:
    """Writes and restores one ps task's snapshot file (``<directory>/ps<task_index>.npz``).

    Args:
      directory: Where snapshots go (created if missing); shared by the ps tasks of a cluster.
      task_index: This ps task's index, which names its file.
      every: Take a snapshot after every ``every`` pushes (at most ``every`` applied steps are
        lost when the ps dies).

    Example:
      >>> ps = ParameterServer(snapshots=Snapshots("/ckpt/ps", task_index=0, every=100))
      ... # doctest: +SKIP
    """

    def __init__(self, directory: str | os.PathLike, task_index: int, every: int) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"Snapshot interval every={every!r} must be a positive number of "
                             f"pushes, e.g. {env.STRATAX_PS_SNAPSHOT_EVERY}=100.")
        self.path = Path(directory) / f"ps{task_index}.npz"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.path)  # of a ps killed while writing
        self.every = every
        self.written = 0  # snapshots written by this process
        self._cond = threading.Condition()
        self._active = 0  # pushes being applied
        self._since = 0   # pushes since the last snapshot
        self._writing = False
        self._server: Any = None
        self._push: Any = None
        self._synchronous = False

    @classmethod
    def configured(cls, task_index: int, directory: str | None = None,
                   every: int | None = None) -> Snapshots | None:
        """Snapshots in ``directory`` every ``every`` pushes; each unset argument falls back to
        ``STRATAX_PS_SNAPSHOT_DIR`` / ``STRATAX_PS_SNAPSHOT_EVERY`` (default 100). None when no
        directory is given either way."""
        directory = directory or config.ps_snapshot_dir
        if not directory:
            return None
        if every is None:
            every = config.ps_snapshot_every
        return cls(directory, task_index, every)

    def attach(self, server: Any) -> None:
        """Restores ``server`` (a ``ParameterServer``) from the snapshot file if there is one,
        and takes a snapshot every ``every`` pushes from now on."""
        self._server = server
        if self.path.exists():
            self._restore()
        self._push = server._methods["push"]
        server._methods["push"] = self._guarded_push

    def _guarded_push(self, frame: wire.Frame) -> bytes:
        if frame.meta.get("sync", 1) != 1 and not self._synchronous:
            self._synchronous = True  # and the snapshots say so: they are not restored
            logger.warning("ps snapshots do not hold synchronous steps' partial sums: %s "
                           "will not be restored (a restarted ps starts empty and the chief "
                           "resumes from its backup or checkpoint)", self.path)
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._active += 1
        try:
            return self._push(frame)
        finally:
            with self._cond:
                self._active -= 1
                self._since += 1
                due = self._since >= self.every and not self._writing
                if due:
                    self._writing, self._since = True, 0
                    while self._active:
                        self._cond.wait()
                self._cond.notify_all()
            if due:
                try:
                    self.write()
                finally:
                    with self._cond:
                        self._writing = False
                        self._cond.notify_all()

    def write(self) -> None:
        """Writes every shard to the snapshot file, atomically (temp file, fsync, rename)."""
        start = time.perf_counter()
        arrays: dict[str, np.ndarray] = {}
        shards = []
        for name, shard in sorted(self._server._shards.items()):
            with shard.lock:
                arrays[f"value/{name}"] = shard.value.copy()
                opt = shard.optimizer
                entry = {"name": name, "optimizer": shard.optimizer_key or None,
                         "iterations": opt.iterations if opt else 0,
                         "slots": sorted(opt.slots) if opt else [],
                         "ledger": sorted(shard.ledger), "duplicates": shard.duplicates}
                for slot in entry["slots"]:
                    arrays[f"slot/{slot}/{name}"] = opt.slots[slot].copy()
            shards.append(entry)
        write_npz(self.path, {"version": VERSION, "session_sha256": self._server.session_digest,
                              "shards": shards, "synchronous": self._synchronous}, arrays)
        self.written += 1
        logger.info("snapshot of %d shard(s) written to %s in %.3f s", len(shards), self.path,
                    time.perf_counter() - start)

    def _restore(self) -> None:
        with np.load(self.path, allow_pickle=False) as data:
            header = json.loads(data[HEADER].tobytes())
            if header.get("version") not in (1, VERSION):
                raise ValueError(f"Snapshot {self.path} has version {header.get('version')!r}, "
                                 f"this stratax reads 1 and {VERSION}; delete it to start "
                                 "afresh.")
            if header.get("synchronous"):
                # It lacks the steps after it, which the other workers will not push again:
                # serving it would lose them silently. Empty, this ps fails the chief's next
                # call, and the run resumes from its backup or checkpoint.
                logger.warning("not restoring snapshot %s: it was written during synchronous "
                               "training, which it cannot resume exactly; starting empty (the "
                               "chief resumes from its backup or checkpoint)", self.path)
                return
            for i, entry in enumerate(header["shards"]):
                key = entry["name"] if header["version"] == VERSION else i
                shard = self._server.shard_type(np.array(data[f"value/{key}"]))
                if entry["optimizer"]:
                    key = json.loads(entry["optimizer"])
                    shard.optimizer = ShardOptimizer(key["spec"], shard.value, key["sparse"])
                    shard.optimizer_key = entry["optimizer"]
                    shard.optimizer.iterations = int(entry["iterations"])
                    for slot in entry["slots"]:
                        shard.optimizer.slots[slot][...] = data[
                            f"slot/{slot}/{entry['name']}" if header["version"] == VERSION
                            else f"slot/{i}/{slot}"]
                shard.ledger = set(entry["ledger"])
                shard.duplicates = int(entry["duplicates"])
                self._server._shards[entry["name"]] = shard
        self._server.session_digest = header.get("session_sha256")
        if isinstance(header.get("session"), str):  # written before the digest replaced the id
            self._server.session_digest = ownership.session_digest(header["session"])
        logger.warning("restored %d shard(s) from snapshot %s (steps applied after it are lost)",
                       len(header["shards"]), self.path)
