"""One Keras program on an emulated TPU pod slice: ``fit`` (with ``validation_data``),
``evaluate`` and ``predict`` of a small CNN (a convolution, then an MLP) under a ``TPUStrategy``
of replicas x 2 logical cores whose ``LayoutMap`` splits kernels over the hosts and the cores; and
a host killed mid-epoch (SIGKILL), the pod relaunched, ``sx.BackupAndRestore`` resuming it.

Usage (one process per host, started by the launcher, which restarts the pod once)::

    KERAS_BACKEND=jax STRATAX_TPU_EMULATION=4 \\
    STRATAX_CPU_DEVICES=4 python -m stratax launch --nproc-per-node 2 --max-restarts 1 \\
        tpu_pod_program.py OUT_DIR BACKUP_DIR

First start: the hosts train with step backups until host 1 SIGKILLs itself mid-epoch
(:func:`interrupt`). Restart: each host resumes that fit from the backup, then evaluates and
predicts, and writes ``OUT_DIR/host_<id>.npz`` (:func:`run`'s results). The test imports
:func:`run` and :func:`interrupt` to compute the same in one process (1 host x 8 cores, whose
interrupted fit raises instead) and the uninterrupted results on one device.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import keras
import numpy as np

import stratax as sx
from stratax._src.keras.callbacks.backup import wait_for_writes

BATCH = 16
# validation_data's, evaluate's and predict's batch size: not fit's (validation's static batch
# size is its own), and one size for all of them, so one test and one predict program serve.
EVAL_BATCH = 8
CORES_PER_REPLICA = 2
TRAIN_ROWS = 102   # 7 batches, the last 6 rows: not split over 4 replicas, padded whole
EVAL_ROWS = 100    # the last batch of 8 has 4 rows: each host pads its own share
EPOCHS = 2
# The interrupted fit stops at its 6th group of steps_per_execution=2 steps (epoch 1, steps
# 2-3), before that group's backup: the resume redoes it from the backup of steps 0-1.
STOP_AT = 6


def data(rows: int) -> tuple[np.ndarray, ...]:
    """``rows`` 8x8 one-channel images, labels of 4 classes and sample weights."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8, 8, 1)).astype(np.float32)
    return x, rng.integers(0, 4, rows), rng.uniform(0.5, 2.0, rows).astype(np.float32)


def layout_map() -> keras.distribution.LayoutMap:
    """The hidden kernel split over the replicas (so over the hosts, FSDP) and the cores
    (tensor-parallel); the head's inputs and the convolution's filters over the cores."""
    layouts = keras.distribution.LayoutMap(None)
    layouts[".*hidden/kernel"] = ("replica", "core")
    layouts[".*head/kernel"] = ("core", None)
    layouts[".*conv/kernel"] = (None, None, None, "core")
    return layouts


def tpu_strategy(resolver: Any) -> sx.TPUStrategy:
    """Every host's cores as replicas of ``CORES_PER_REPLICA`` logical cores, :func:`layout_map`."""
    topology = sx.tpu.experimental.initialize_tpu_system(resolver)
    cores = len(topology.devices)
    assignment = sx.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=[1, 1, 1, CORES_PER_REPLICA],
        num_replicas=cores // CORES_PER_REPLICA)
    return sx.TPUStrategy(resolver, experimental_device_assignment=assignment,
                          layout_map=layout_map())


def build(strategy: Any) -> keras.Model:
    """A small CNN: a convolution over 8x8 images, then an MLP; unweighted and weighted
    metrics, ``steps_per_execution=2``."""
    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([
            keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
            keras.layers.Flatten(), keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(4, name="head")])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"],
                      weighted_metrics=[keras.metrics.SparseCategoricalCrossentropy(
                          from_logits=True, name="w_xent")],
                      steps_per_execution=2)
    return model


class _Groups(keras.callbacks.Callback):
    """Counts ``fit``'s groups of steps; at the ``stop_at``-th (mid-epoch) ends ``fit`` with
    an error, unless ``stop_at`` is ``None``; with ``kill_after_backup_in``, SIGKILLs this
    process instead, once the backup in flight to that directory is committed (so the resume
    point is the previous group's, as when a kill falls between two saves)."""

    def __init__(self, stop_at: int | None = None,
                 kill_after_backup_in: str | None = None) -> None:
        super().__init__()
        self.stop_at, self.backup_dir = stop_at, kill_after_backup_in
        self.groups = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.groups += 1
        if self.groups != self.stop_at:
            return
        if self.backup_dir is not None:
            wait_for_writes(self.backup_dir)
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("stopped mid-epoch")


def _fit(model: keras.Model, callbacks: list[Any], **kwargs: Any) -> keras.callbacks.History:
    x, y, w = data(TRAIN_ROWS)
    return model.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=EPOCHS, shuffle=True,
                     verbose=0, callbacks=callbacks, **kwargs)


def _per_host_inputs(model: keras.Model, strategy: Any) -> tuple[dict[str, Any], np.ndarray]:
    """evaluate and predict on the evaluation rows; on several hosts each host feeding its own
    batches (``AutoShardPolicy.OFF``): host ``h`` has rows ``[8i + 4h, 8i + 4h + 4)`` of step
    ``i``, and the last step's 4 rows split 3 + 1, so the hosts' row counts differ there."""
    x, y, w = data(EVAL_ROWS)
    hosts = strategy.num_processes
    if hosts == 1:
        return (model.evaluate(x, y, sample_weight=w, batch_size=EVAL_BATCH, verbose=0,
                               return_dict=True),
                model.predict(x, batch_size=EVAL_BATCH, verbose=0))
    if hosts != 2:
        raise ValueError(f"the per-host rows are written for 2 hosts; received {hosts}")
    full, share = EVAL_ROWS // EVAL_BATCH * EVAL_BATCH, EVAL_BATCH // hosts
    bounds = [(start + h * share, start + (h + 1) * share)
              for start in range(0, full, EVAL_BATCH) for h in range(hosts)]
    bounds += [(full, full + 3), (full + 3, EVAL_ROWS)]
    own = [slice(*b) for b in bounds[strategy.process_rank::hosts]]
    per_host = sx.InputOptions(auto_shard_policy=sx.AutoShardPolicy.OFF)
    scores = model.evaluate(strategy.experimental_distribute_dataset(
        [(x[r], y[r], w[r]) for r in own], options=per_host), verbose=0, return_dict=True)
    predictions = model.predict(strategy.experimental_distribute_dataset(
        [(x[r],) for r in own], options=per_host), verbose=0)
    return scores, predictions


def run(strategy: Any, backup_dir: str | None = None) -> dict[str, np.ndarray]:
    """fit with validation (history, weights), evaluate, predict, and the error of a batch
    size that does not split over the replicas (``split_error``). With ``backup_dir``, the fit
    resumes from the backup there (:func:`interrupt`): its history is then the resumed
    epoch's, its train metrics over the steps run after the resume; ``groups`` counts the
    groups of steps it ran."""
    model, groups = build(strategy), _Groups()
    backup = [] if backup_dir is None else [sx.BackupAndRestore(backup_dir, save_freq=2)]
    x, y, w = data(EVAL_ROWS)
    history = _fit(model, [*backup, groups], validation_data=(x, y, w),
                   validation_batch_size=EVAL_BATCH).history
    scores = model.evaluate(x, y, sample_weight=w, batch_size=EVAL_BATCH, verbose=0,
                            return_dict=True)
    results = {f"history_{k}": np.asarray(v) for k, v in history.items()}
    results["groups"] = np.asarray(groups.groups)
    results.update({f"eval_{k}": np.asarray(v) for k, v in scores.items()})
    # 102 rows: the last batch of 6 does not split over 4 replicas
    results["predict"] = model.predict(data(TRAIN_ROWS)[0], batch_size=EVAL_BATCH, verbose=0)
    scores, predictions = _per_host_inputs(model, strategy)
    results.update({f"host_eval_{k}": np.asarray(v) for k, v in scores.items()})
    results["host_predict"] = predictions
    results.update({f"weight_{i}": v for i, v in enumerate(model.get_weights())})
    # On several hosts no host holds the hidden kernel whole (split over the replicas).
    results["split_hidden_kernel"] = np.asarray(
        not model.get_layer("hidden").kernel.value.is_fully_addressable)
    results["plan"] = np.asarray(f"{model.train_function.plan.name} over "
                                 f"{model.train_function.plan.over}")
    if strategy.num_replicas_in_sync > 1:   # (one device would train on)
        try:
            model.fit(x, y, batch_size=BATCH - 2, verbose=0)
        except ValueError as err:
            results["split_error"] = np.asarray(str(err))
    return results


def interrupt(strategy: Any, backup_dir: str, victim: bool = True, kill: bool = False) -> None:
    """The fit of :func:`run` with backups in ``backup_dir``, stopped at its ``STOP_AT``-th
    group of steps by an error, or with ``kill`` by a SIGKILL of this process once its last
    backup is committed; a process not the ``victim`` goes on until its peers fail it.

    Raises:
        AssertionError: the fit ran to its end.
    """
    stop = [_Groups(STOP_AT, kill_after_backup_in=backup_dir if kill else None)] if victim else []
    try:
        _fit(build(strategy), [*stop, sx.BackupAndRestore(backup_dir, save_freq=2)])
    except RuntimeError as err:
        if "stopped mid-epoch" not in str(err):
            raise
    else:
        raise AssertionError("the interrupted fit did not stop")


def main() -> None:
    out_dir, backup_dir = sys.argv[1:3]
    # Emulated, under `stratax launch`: the launcher's processes are the pod's hosts.
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="")
    sx.config.experimental_connect_to_cluster(resolver)
    strategy = tpu_strategy(resolver)
    host = strategy.process_rank
    if os.environ["STRATAX_RESTART_COUNT"] == "0":
        # Host 1 dies mid-epoch; host 0 waits on it in the next collective (or the next
        # backup's commit) until the launcher stops the pod and starts it again.
        interrupt(strategy, backup_dir, victim=host == 1, kill=True)
    results = run(strategy, backup_dir)
    results["replicas"] = np.asarray(strategy.num_replicas_in_sync)
    results["hosts"] = np.asarray(strategy.num_processes)
    np.savez(os.path.join(out_dir, f"host_{host}.npz"), **results)
    print("completed", host, flush=True)


if __name__ == "__main__":
    main()
