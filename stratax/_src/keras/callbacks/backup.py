"""``BackupAndRestore``: step-level backups that resume a run exactly where it stopped.

Keras' own callback resumes at the start of the interrupted epoch. This one saves, every
``save_freq`` steps (or epochs), everything a synchronous run needs to continue as if it had
never stopped: model variables (Keras' seed-generator state included), optimizer slots and
iteration count, metric accumulators, the epoch and the position in the data. On restart
``fit`` skips the batches already trained in the interrupted epoch; with arrays as input the
epoch's order is a pure function of the epoch number, so the same batches follow.

Preemption: a SIGTERM to any worker makes all workers agree on a step (JAX's preemption sync
point in multi-process runs, a signal flag in one process), save there, and exit with
``PREEMPTION_EXIT_CODE``; ``stratax launch --max-restarts K`` then restarts the group, which
resumes from that backup. Only the chief writes, atomically (see ``checkpoint.versions``); every
worker reads the same directory, so it must be shared between hosts (as in TensorFlow). State
that no process holds whole (a ``layout_map`` splitting variables over several workers'
devices) is written by every worker, each its own shards, and committed once all are on disk
(``checkpoint.sharded_state``); it restores into any number of workers and any layout.

Saves do not stall training: the step copies the state to host memory (a memcpy) and a
background thread writes it, one save at a time; the next save, the end of ``fit``, a
preemption and a restore from the same directory wait for it, and a failed write raises there.
Entries are named by variable path (``model/sequential/dense/kernel``, ``optimizer/adam/...``,
``metrics/...``); ``docs/design/checkpoints.md`` says why this is not Orbax.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
from jax.experimental import multihost_utils

from stratax._src import seam
from stratax._src.checkpoint import versions
from stratax._src.keras import binding, call_stack
from stratax._src.keras.runners.runner import runner_for
from stratax._src.parameter_server.shard_init import remote_recipe
from stratax._src.runtime import worker_exit

logger = logging.getLogger(__name__)

PREEMPTION_EXIT_CODE = 42
_FORMAT = 2  # 1: arrays by position (arr_0, ...); 2: by name (model/..., optimizer/...)
# Beside the versions: the sharded checkpoints of the variables the parameter servers build,
# written by the servers; a version's metadata names the one it goes with.
_SERVERS = "servers"
_pending: dict[str, _Write] = {}  # backup_dir -> its write in flight (any callback's)
_pending_lock = threading.Lock()


class _Write:
    """One backup written by its own (non-daemon: it finishes before Python exits) thread,
    which calls ``write()``."""

    def __init__(self, write: Callable[[], Any]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(write,),
                                       name="stratax-backup-write")
        self.thread.start()

    def _run(self, write: Callable[[], Any]) -> None:
        try:
            write()
        except BaseException as err:  # raised by wait_for_writes, in the training thread
            self.error = err

    def result(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


class BackupAndRestore(keras.callbacks.Callback):
    """Backs up training every ``save_freq`` steps and resumes mid-epoch after a failure.

    Args:
        backup_dir: where backups live (shared by all workers; only the chief writes).
        save_freq: ``"epoch"`` or a number of steps.
        delete_checkpoint: remove the backup when training completes.
        save_in_background: write each backup in a background thread (training goes on
            once the state is copied); ``False`` writes it before the step returns.

    Example:
        >>> backup = sx.BackupAndRestore("/tmp/backup", save_freq=100)
        >>> model.fit(x, y, epochs=5, batch_size=256, callbacks=[backup])
    """

    def __init__(self, backup_dir: str, save_freq: int | str = "epoch",
                 delete_checkpoint: bool = True, save_in_background: bool = True) -> None:
        super().__init__()
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int)
                                     or save_freq < 1):
            raise ValueError(
                f"save_freq must be 'epoch' or a positive number of steps; received {save_freq!r}."
            )
        if not backup_dir:
            raise ValueError("backup_dir is empty; pass a directory shared by all workers.")
        self.backup_dir = str(backup_dir)
        self.save_freq = save_freq
        self.delete_checkpoint = delete_checkpoint
        self.save_in_background = save_in_background
        self._strategy: Any = None
        self._epoch = 0
        self._steps_in_epoch = 0
        self._skip = 0
        self._global_step = 0
        self._consumed_offset = 0
        self._completed = False
        self._sigterm = threading.Event()
        self._sigterm_notice: worker_exit.SigtermNotice | None = None
        self._sharded: set[str] | None = None

    # --------------------------------------------------------------- lifecycle
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._strategy = binding.model_strategy(self.model)
        if self._strategy is None:
            raise RuntimeError(
                "sx.BackupAndRestore needs a model built under a strategy scope, e.g. "
                "`with sx.OneDeviceStrategy('cpu:0').scope(): model = ...`."
            )
        self._completed = False
        self._sharded = None
        wait_for_writes(self.backup_dir)
        restored = versions.load(self.backup_dir)
        if restored is not None:
            self._restore(*restored)
        self._hold_at_next_save()
        self._sigterm.clear()
        self._sigterm_notice = worker_exit.SigtermNotice(self._strategy.is_multi_process,
                                                         self._sigterm)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._steps_in_epoch = self._skip
        self._skip = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        steps = self._consumed_offset + batch + 1
        self._global_step += steps - self._steps_in_epoch
        self._steps_in_epoch = steps
        if self._preemption_reached():
            self._save(self._epoch, self._steps_in_epoch)
            wait_for_writes(self.backup_dir)
            logger.warning("Preempted: saved a backup at step %d, exiting with code %d.",
                           self._global_step, PREEMPTION_EXIT_CODE)
            raise SystemExit(PREEMPTION_EXIT_CODE)
        if isinstance(self.save_freq, int) and self._global_step % self.save_freq == 0:
            self._save(self._epoch, self._steps_in_epoch)
        self._hold_at_next_save()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._consumed_offset = 0
        if self.save_freq == "epoch":
            self._save(epoch + 1, 0)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._completed = True
        if self._sigterm_notice is not None:
            self._sigterm_notice.give_back()
        wait_for_writes(self.backup_dir)
        if self.delete_checkpoint and self._strategy.is_chief:
            versions.remove(self.backup_dir)
            shutil.rmtree(os.path.join(self.backup_dir, _SERVERS), ignore_errors=True)

    # --------------------------------------------------------------- state
    def _hold_at_next_save(self) -> None:
        """Tells the runner where the next step-count save reads the state, so that no step
        runs past it before (parameter-server steps run ahead of the callbacks)."""
        if isinstance(self.save_freq, int):
            runner_for(self._strategy).hold_after(
                self.model, self.save_freq - self._global_step % self.save_freq)

    def _normalize(self, epoch: int, steps_in_epoch: int) -> tuple[int, int]:
        """A position at the end of an epoch is the start of the next one."""
        steps_per_epoch = (self.params or {}).get("steps")
        if steps_per_epoch and steps_in_epoch >= steps_per_epoch:
            return epoch + 1, 0
        return epoch, steps_in_epoch

    def _state_variables(self) -> dict[str, Any]:
        """Every variable of the run by its entry name: ``model/<path>``, ``optimizer/<path>``,
        ``metrics/<path>`` (a repeated path gets ``#1``, ``#2``, ...)."""
        model = self.model
        optimizer_vars = list(model.optimizer.variables) if model.optimizer is not None else []
        named: dict[str, Any] = {}
        for group, variables in (("model", model.variables), ("optimizer", optimizer_vars),
                                 ("metrics", model.metrics_variables)):
            for variable in variables:
                if remote_recipe(variable) is None:  # else saved by its servers
                    versions.add_named(named, f"{group}/{variable.path}", variable)
        return named

    def _held_in_parts(self) -> set[str]:
        """The entries no process holds whole (model parallelism across processes): each
        process writes its own shards of them. Found once per ``fit``."""
        if self._sharded is None:
            self._sharded = set()
            if self._strategy.is_multi_process:
                self.model.jax_state_sync()
                self._sharded = versions.held_in_parts(self._state_variables())
        return self._sharded

    def _save(self, epoch: int, steps_in_epoch: int) -> None:
        sharded = self._held_in_parts()
        if not sharded and not self._strategy.is_chief:
            return
        epoch, steps_in_epoch = self._normalize(epoch, steps_in_epoch)
        self.model.jax_state_sync()
        runner_for(self._strategy).before_save(self.model)

        def meta() -> dict[str, Any]:
            feed = _running_feed()
            return {"format": _FORMAT, "epoch": epoch, "steps_in_epoch": steps_in_epoch,
                    "global_step": self._global_step,
                    "data_seed": None if feed is None else feed.seed,
                    **runner_for(self._strategy).save_held_elsewhere(
                        self.model, os.path.join(self.backup_dir, _SERVERS))}

        write = versions.prepare_save(self.backup_dir, self._state_variables(), meta,
                                           sharded, self._strategy.is_chief)
        wait_for_writes(self.backup_dir)
        if write is None:
            return
        if not self.save_in_background:
            write()
            return
        with _pending_lock:
            _pending[os.path.abspath(self.backup_dir)] = _Write(write)

    def _restore(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        if meta.get("format") not in (1, _FORMAT):
            raise ValueError(
                f"The backup in {self.backup_dir!r} has format {meta.get('format')!r}; this "
                f"stratax reads formats 1 and {_FORMAT}. Use another backup_dir, or delete this "
                "one to start over.")
        for variable, value in versions.match(arrays, self._state_variables(),
                                                   f"The backup in {self.backup_dir!r}",
                                                   "backup_dir"):
            versions.assign(variable, value)
        runner_for(self._strategy).after_restore(self.model)
        runner_for(self._strategy).restore_held_elsewhere(
            self.model, os.path.join(self.backup_dir, _SERVERS), meta)
        epoch, self._skip = self._normalize(int(meta["epoch"]), int(meta["steps_in_epoch"]))
        seam.set_initial_epoch(self.model, epoch)
        self._consumed_offset = self._skip
        self._global_step = int(meta["global_step"])
        call = call_stack.active()
        if call is not None:
            call.resumed_step = self._global_step
        feed = _running_feed()
        if feed is not None:
            feed.resume_at(epoch, self._skip)
            if meta.get("data_seed") is not None:
                feed.seed = int(meta["data_seed"])
        logger.info("Resuming from %s: epoch %d, step %d of the epoch.", self.backup_dir,
                    epoch, self._skip)

    # --------------------------------------------------------------- preemption
    def _preemption_reached(self) -> bool:
        if self._strategy.is_multi_process:
            return bool(multihost_utils.reached_preemption_sync_point(self._global_step))
        return self._sigterm.is_set()


def wait_for_writes(backup_dir: str) -> None:
    """Waits for the background write to ``backup_dir`` in flight, if any; raises its error."""
    with _pending_lock:
        pending = _pending.pop(os.path.abspath(backup_dir), None)
    if pending is not None:
        pending.result()


def _running_feed() -> Any:
    """The feed of the ``fit`` this callback runs in (``None`` for inputs left to Keras)."""
    call = call_stack.active()
    return None if call is None else call.feed
