"""One Keras program on an emulated TPU pod slice: ``fit``/``evaluate``/``predict`` and a
mid-epoch ``BackupAndRestore`` resume under a ``TPUStrategy`` whose hosts are processes.

Usage (one process per host; the environment describes the pod as on a TPU VM)::

    KERAS_BACKEND=jax TPU_WORKER_HOSTNAMES=127.0.0.1,127.0.0.1 TPU_WORKER_ID=<host> \\
    STRATAX_TPU_EMULATION=2 STRATAX_CPU_DEVICES=2 \\
        python tpu_pod_program.py OUT_DIR BACKUP_DIR COORDINATOR_ADDRESS

Each host writes ``OUT_DIR/host_<id>.npz`` (:func:`run`'s results). The test imports
:func:`run` to compute the same results in one process (one device, and 1 host x 4 cores).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import keras
import numpy as np

import stratax as sx

BATCH = 16
TRAIN_ROWS = 102   # 7 batches, the last 6 rows: not split over 4 replicas, padded whole
EVAL_ROWS = 100    # the last batch 4 rows: each host pads its own share
EPOCHS = 2
# The interrupted fit stops at its 6th group of steps_per_execution=2 steps (epoch 1, steps
# 2-3), before that group's backup: the resume redoes it from the backup of steps 0-1.
STOP_AT = 6


def data(rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 12)).astype(np.float32)
    return x, rng.integers(0, 4, rows), rng.uniform(0.5, 2.0, rows).astype(np.float32)


def build(strategy: Any) -> keras.Model:
    """An MLP with an unweighted and weighted metrics, ``steps_per_execution=2``."""
    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(4)])
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"],
                      weighted_metrics=[keras.metrics.SparseCategoricalCrossentropy(
                          from_logits=True, name="w_xent")],
                      steps_per_execution=2)
    return model


class _Groups(keras.callbacks.Callback):
    """Counts ``fit``'s groups of steps; ends it with an error at the ``stop_at``-th (a crash,
    mid-epoch) unless ``stop_at`` is ``None``."""

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self.stop_at = stop_at
        self.groups = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.groups += 1
        if self.groups == self.stop_at:
            raise RuntimeError("stopped mid-epoch")


def _fit(model: keras.Model, callbacks: list[Any]) -> keras.callbacks.History:
    x, y, w = data(TRAIN_ROWS)
    return model.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=EPOCHS, shuffle=True,
                     verbose=0, callbacks=callbacks)


def _per_host_inputs(model: keras.Model, strategy: Any) -> tuple[dict[str, Any], np.ndarray]:
    """evaluate and predict on the evaluation rows; on several hosts each host feeding its own
    batches (``AutoShardPolicy.OFF``): host ``h`` has rows ``[16i + 8h, 16i + 8h + 8)`` of step
    ``i``, and the last step's 4 rows split 3 + 1, so the hosts' row counts differ there."""
    x, y, w = data(EVAL_ROWS)
    hosts = strategy.num_processes
    if hosts == 1:
        return (model.evaluate(x, y, sample_weight=w, batch_size=BATCH, verbose=0,
                               return_dict=True),
                model.predict(x, batch_size=BATCH, verbose=0))
    if hosts != 2:
        raise ValueError(f"the per-host rows are written for 2 hosts; received {hosts}")
    full = EVAL_ROWS // BATCH * BATCH
    bounds = [(start + h * BATCH // 2, start + (h + 1) * BATCH // 2)
              for start in range(0, full, BATCH) for h in range(hosts)]
    bounds += [(full, full + 3), (full + 3, EVAL_ROWS)]
    own = [slice(*b) for b in bounds[strategy.process_rank::hosts]]
    per_host = sx.InputOptions(auto_shard_policy=sx.AutoShardPolicy.OFF)
    scores = model.evaluate(strategy.experimental_distribute_dataset(
        [(x[r], y[r], w[r]) for r in own], options=per_host), verbose=0, return_dict=True)
    predictions = model.predict(strategy.experimental_distribute_dataset(
        [(x[r],) for r in own], options=per_host), verbose=0)
    return scores, predictions


def run(strategy: Any, backup_dir: str | None = None) -> dict[str, np.ndarray]:
    """fit (history, weights), evaluate, predict; with ``backup_dir`` also the weights of a
    fit stopped mid-epoch and resumed from its backup (``resumed_*``) and how many groups of
    steps the resumed fit ran (``resumed_groups``); the error of a batch size that does not
    split over the replicas (``split_error``)."""
    model = build(strategy)
    history = _fit(model, []).history
    x, y, w = data(EVAL_ROWS)
    scores = model.evaluate(x, y, sample_weight=w, batch_size=BATCH, verbose=0,
                            return_dict=True)
    results = {f"history_{k}": np.asarray(v) for k, v in history.items()}
    results.update({f"eval_{k}": np.asarray(v) for k, v in scores.items()})
    results["predict"] = model.predict(data(TRAIN_ROWS)[0], batch_size=BATCH, verbose=0)
    scores, predictions = _per_host_inputs(model, strategy)
    results.update({f"host_eval_{k}": np.asarray(v) for k, v in scores.items()})
    results["host_predict"] = predictions
    results.update({f"weight_{i}": v for i, v in enumerate(model.get_weights())})
    results["plan"] = np.asarray(f"{model.train_function.plan.name} over "
                                 f"{model.train_function.plan.over}")
    if backup_dir is not None:
        interrupted = build(strategy)
        try:
            _fit(interrupted, [_Groups(STOP_AT), sx.BackupAndRestore(backup_dir, save_freq=2)])
        except RuntimeError as err:
            if "stopped mid-epoch" not in str(err):
                raise
        else:
            raise AssertionError("the interrupted fit did not stop")
        resumed, groups = build(strategy), _Groups()
        _fit(resumed, [sx.BackupAndRestore(backup_dir, save_freq=2), groups])
        results.update({f"resumed_{i}": v for i, v in enumerate(resumed.get_weights())})
        results["resumed_groups"] = np.asarray(groups.groups)
    try:
        model.fit(x, y, batch_size=BATCH - 2, verbose=0)
    except ValueError as err:
        results["split_error"] = np.asarray(str(err))
    return results


def main() -> None:
    out_dir, backup_dir, coordinator = sys.argv[1:4]
    resolver = sx.cluster_resolver.TPUClusterResolver(tpu="", coordinator_address=coordinator)
    sx.config.experimental_connect_to_cluster(resolver)
    sx.tpu.experimental.initialize_tpu_system(resolver)
    strategy = sx.TPUStrategy(resolver)
    results = run(strategy, backup_dir)
    results["replicas"] = np.asarray(strategy.num_replicas_in_sync)
    results["hosts"] = np.asarray(strategy.num_processes)
    np.savez(os.path.join(out_dir, f"host_{strategy.process_rank}.npz"), **results)
    print("completed", strategy.process_rank, flush=True)


if __name__ == "__main__":
    main()
