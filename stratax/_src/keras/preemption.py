"""``PreemptionCheckpointHandler``: save on a preemption notice in a custom loop, and resume.

TensorFlow's ``tf.distribute.experimental.PreemptionCheckpointHandler`` for the loops that do not
go through ``fit`` (where ``sx.BackupAndRestore`` does the same job). A SIGTERM to any worker (a
preemption notice, or ``kill``) makes every worker agree on a step, the step JAX's preemption
service picks (``multihost_utils.reached_preemption_sync_point``, as ``sx.BackupAndRestore``
uses it); there, at the end of a ``run`` call, the chief writes a checkpoint of the given Keras
objects and of ``total_run_calls`` (``checkpoint.versions``: atomic, versioned; state split over
several workers' devices is written by every worker, each its own shards), every worker
waits for it, and the program exits with ``PREEMPTION_EXIT_CODE`` (or calls
``TerminationConfig.exit_fn``). Made again after the restart, the handler restores the latest
checkpoint, so the loop resumes at ``total_run_calls``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

import keras
from jax.experimental import multihost_utils

from stratax._src.checkpoint import versions
from stratax._src.cluster.process_layout import process_layout
from stratax._src.keras.callbacks.backup import PREEMPTION_EXIT_CODE
from stratax._src.runtime import worker_exit

logger = logging.getLogger(__name__)

_FORMAT = 1


class TerminationConfig:
    """How a ``PreemptionCheckpointHandler`` learns of a preemption and ends the program.

    TensorFlow's ``tf.distribute.experimental.TerminationConfig``.

    Args:
        termination_watcher_fn: A function returning ``True`` once the platform announced a
            preemption (e.g. by polling a metadata server); asked at each ``run`` call, as well
            as SIGTERM being watched.
        exit_fn: Called after the checkpoint is saved; by default the program exits with
            ``PREEMPTION_EXIT_CODE`` (42), which ``stratax launch --max-restarts`` restarts.
        grace_period: Seconds the platform leaves between its notice and the kill (TensorFlow
            uses it on GCE); the save happens at the next agreed step, which must fit in it.
        save_fn: Called instead of writing the checkpoint (the handler still restores from
            ``checkpoint_dir``), e.g. to save elsewhere.

    Example:
        >>> config = sx.experimental.TerminationConfig(                    # doctest: +SKIP
        ...     exit_fn=lambda: sys.exit(0))
    """

    def __init__(self, termination_watcher_fn: Callable[[], bool] | None = None,
                 exit_fn: Callable[[], Any] | None = None, grace_period: float | None = None,
                 save_fn: Callable[[], Any] | None = None) -> None:
        for name, fn in (("termination_watcher_fn", termination_watcher_fn),
                         ("exit_fn", exit_fn), ("save_fn", save_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"TerminationConfig({name}=...) must be callable, got {fn!r}.")
        if grace_period is not None and not grace_period >= 0:
            raise ValueError(f"grace_period must be >= 0 seconds, got {grace_period!r}.")
        self.termination_watcher_fn = termination_watcher_fn
        self.exit_fn = exit_fn
        self.grace_period = grace_period
        self.save_fn = save_fn


def _variables_of(obj: Any, where: str) -> list[Any]:
    """The Keras variables ``obj`` holds (a model's include its built optimizer's)."""
    if isinstance(obj, keras.Variable):
        return [obj]
    if isinstance(obj, keras.Model):
        optimizer = getattr(obj, "optimizer", None)
        extra = list(optimizer.variables) if optimizer is not None and optimizer.built else []
        return list(obj.variables) + extra
    if hasattr(obj, "variables"):  # a layer, an optimizer, a metric
        return list(obj.variables)
    raise TypeError(
        f"{where} is a {type(obj).__name__}; a checkpoint holds Keras models, optimizers, "
        "layers, metrics or variables, e.g. {'model': model, 'optimizer': optimizer} (what "
        "TensorFlow's tf.train.Checkpoint(model=model, optimizer=optimizer) holds)."
    )


def _named_variables(checkpoint: Any) -> dict[str, Any]:
    """Every variable of ``checkpoint`` by entry name ``<key>/<path>`` (``#n`` for repeats)."""
    if isinstance(checkpoint, Mapping):
        items = [(str(key), value) for key, value in checkpoint.items()]
    elif isinstance(checkpoint, (list, tuple)):
        items = [(str(i), value) for i, value in enumerate(checkpoint)]
    else:
        items = [("0", checkpoint)]
    named: dict[str, Any] = {}
    seen: set[int] = set()
    for key, obj in items:
        for variable in _variables_of(obj, f"checkpoint[{key!r}]"):
            if id(variable) in seen:
                continue
            seen.add(id(variable))
            versions.add_named(named, f"{key}/{variable.path}", variable)
    return named


class PreemptionCheckpointHandler:
    """Saves a checkpoint when a worker is preempted, and restores it when made again.

    TensorFlow's ``tf.distribute.experimental.PreemptionCheckpointHandler`` (module docstring).
    Made, it restores the latest checkpoint in ``checkpoint_dir`` if there is one, then watches
    for SIGTERM. Wrap each step of the loop in :meth:`run`; the notice is acted on at the end of
    the ``run`` call the workers agree on.

    Args:
        cluster_resolver: The strategy's ``cluster_resolver`` (which process is the chief).
        checkpoint_or_checkpoint_manager: What to save: Keras models, optimizers, layers,
            metrics or variables, alone or in a dict (``{"model": model, "optimizer":
            optimizer}``, as ``tf.train.Checkpoint(model=..., optimizer=...)``) or list. Build
            the optimizer first (``optimizer.build(model.trainable_variables)``), so that its
            state exists to be restored.
        checkpoint_dir: Where checkpoints go; every worker must see it (a shared filesystem).
        termination_config: A ``TerminationConfig``.

    Raises:
        ValueError: ``checkpoint_dir`` missing, or a checkpoint there that does not match the
            variables given.
        TypeError: Something given that holds no Keras variables.

    Example:
        >>> handler = sx.experimental.PreemptionCheckpointHandler(            # doctest: +SKIP
        ...     strategy.cluster_resolver, {"model": model, "optimizer": optimizer}, "/ckpt")
        >>> for step in range(handler.total_run_calls, STEPS):                  # doctest: +SKIP
        ...     handler.run(distributed_train_step, next(iterator))
    """

    def __init__(self, cluster_resolver: Any, checkpoint_or_checkpoint_manager: Any,
                 checkpoint_dir: str | os.PathLike[str] | None = None,
                 termination_config: TerminationConfig | None = None) -> None:
        if checkpoint_dir is None:
            raise ValueError(
                "PreemptionCheckpointHandler needs checkpoint_dir, a directory every worker "
                "sees, e.g. PreemptionCheckpointHandler(resolver, checkpoint, '/shared/ckpt')."
            )
        layout = process_layout(cluster_resolver)
        self._multi_process = layout.num_processes > 1
        self._is_chief = layout.process_id == 0
        self._variables = _named_variables(checkpoint_or_checkpoint_manager)
        self._dir = os.fspath(checkpoint_dir)
        self._config = termination_config or TerminationConfig()
        self._run_calls = 0
        self._notice = threading.Event()
        self._restore()
        self._sigterm = worker_exit.SigtermNotice(self._multi_process, self._notice)

    @property
    def total_run_calls(self) -> int:
        """``run`` calls made so far, counting those before the restart (restored)."""
        return self._run_calls

    def run(self, distributed_train_function: Callable[..., Any], *args: Any,
            **kwargs: Any) -> Any:
        """Runs one step, ``distributed_train_function(*args, **kwargs)``, and returns its
        result; at the step the workers agree on after a notice, saves and exits."""
        result = distributed_train_function(*args, **kwargs)
        self._run_calls += 1
        self.save_checkpoint_if_preempted()
        return result

    def save_checkpoint_if_preempted(self) -> None:
        """Saves and exits if a notice arrived and this is the step the workers agreed on
        (for loops that do not call :meth:`run`; call it once per step on every worker)."""
        watcher = self._config.termination_watcher_fn
        if watcher is not None and watcher() and not self._notice.is_set():
            self._announce()
        if not self._preemption_reached():
            return
        self._save()
        self._sigterm.give_back()
        exit_fn = self._config.exit_fn
        if exit_fn is not None:
            exit_fn()
            return
        logger.warning("Preempted: saved a checkpoint at run call %d, exiting with code %d.",
                       self._run_calls, PREEMPTION_EXIT_CODE)
        raise SystemExit(PREEMPTION_EXIT_CODE)

    # ------------------------------------------------------------------ internals
    def _preemption_reached(self) -> bool:
        if self._multi_process:
            return bool(multihost_utils.reached_preemption_sync_point(self._run_calls))
        return self._notice.is_set()

    def _announce(self) -> None:
        """A notice from ``termination_watcher_fn``: JAX's notifier hears it as a SIGTERM."""
        if self._sigterm.routed:
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            self._notice.set()

    def _save(self) -> None:
        if self._config.save_fn is not None:
            self._config.save_fn()
        else:
            sharded = (versions.held_in_parts(self._variables) if self._multi_process
                       else set())
            write = versions.prepare_save(
                self._dir, self._variables,
                lambda: {"format": _FORMAT, "total_run_calls": self._run_calls}, sharded,
                self._is_chief)
            if write is not None:
                write()
        if self._multi_process:  # no worker leaves before the chief's checkpoint is complete
            multihost_utils.sync_global_devices("stratax preemption checkpoint saved")

    def _restore(self) -> None:
        restored = versions.load(self._dir)
        if restored is None:
            return
        arrays, meta = restored
        if meta.get("format") != _FORMAT:
            raise ValueError(
                f"{self._dir!r} holds no PreemptionCheckpointHandler checkpoint (format "
                f"{meta.get('format')!r}); use another checkpoint_dir.")
        where = f"The checkpoint in {self._dir!r} (build the optimizer before the handler)"
        for variable, value in versions.match(arrays, self._variables, where,
                                                   "checkpoint_dir"):
            versions.assign(variable, value)
        self._run_calls = int(meta["total_run_calls"])
        logger.info("Restored %s at run call %d.", self._dir, self._run_calls)
