"""stratax's tasks in ``benchmarks.workloads.recsys``: the DLRM model under ParameterServerStrategy
(all variables on the servers, or hybrid), MultiWorkerMirroredStrategy, or no strategy at all,
trained with ``model.fit`` on the same arrays.

argv: ``ps``, ``hybrid``, ``mwms`` or ``one``, the data directory (``recsys_data.ensure``), a
JSON of options (``batch``: global batch, ``warm_steps``: batches of the untimed first ``fit``
that compiles the step, ``spe``: ``steps_per_execution``).

- ``ps``: every task of a chief + workers + ps cluster on 127.0.0.1 runs this file with its
  TF_CONFIG (``benchmarks.cluster.launch`` starts them); workers and ps serve inside the strategy's
  constructor. Every variable lives on the ps (asynchronous updates, TensorFlow's placement);
  the 26 ``Embedding`` tables take the row-sparse path; tables of 256 KiB or more are split
  over 2 ps (``MinSizePartitioner``, as TF's program does).
- ``hybrid``: the same cluster and partitioner, ``mode="sync", dense_variables="workers"``:
  the tables stay on the ps (read row-sparse, updated synchronously), every other variable is
  replicated on the workers, which sum their gradients among themselves (the exchange) and
  apply them locally; each step runs on every worker with its part of the global batch.
- ``mwms``: each process of ``stratax launch --workers 2`` runs it; every table is replicated
  and its (dense) gradient all-reduced.
- ``one``: one process, plain Keras (no strategy), the same global batch: the synchronous
  one-process reference for the AUC.

Each trains on the warm-up batches, then on the whole training set (timed, 1 epoch, no
shuffle), predicts the held-out set and prints ``RESULT {json}`` (the chief, every MWMS
process, or the one process, with its own peak RSS).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import stratax as sx
from benchmarks.workloads import recsys_data, recsys_model


def _inputs(split: dict[str, np.ndarray], rows: slice = slice(None)) -> dict[str, np.ndarray]:
    return {"dense": split["dense"][rows], "ids": split["ids"][rows]}


def _pulled_bytes(strategy: Any, model: Any) -> int:
    """Bytes the parameter servers have sent so far, from their counters: whole reads of a
    shard (``whole_pulls`` x its bytes) and rows read row-sparse (``rows_pulled`` x a row)."""
    total = 0
    for variable in model.trainable_variables:
        row = int(np.prod(variable.shape[1:], dtype=np.int64)) * 4
        for shard in strategy.shard_stats(variable):
            total += shard["whole_pulls"] * shard["bytes"] + shard["rows_pulled"] * row
    return total


def _worker_seconds(strategy: Any) -> dict[str, float]:
    """The coordinator's counters summed over the workers: steps and seconds per part of a
    step (``pull``, ``compute``, ``push``, ``data``, ``exchange`` in hybrid mode)."""
    total: dict[str, float] = {}
    for stats in strategy.cluster_coordinator().stats().values():
        for key in ("steps", "wall", "pull", "compute", "push", "data", "exchange"):
            total[key] = total.get(key, 0.0) + float(stats.get(key, 0.0))
    return total


def _table_variables(keras: Any, model: Any) -> set[int]:
    """``id`` of every ``Embedding`` table of ``model`` (what hybrid mode keeps on the ps)."""
    return {id(layer.embeddings) for layer in model.layers
            if isinstance(layer, keras.layers.Embedding)}


def make_strategy(system: str) -> Any:
    """``system``'s strategy (None for ``one``). Under ``ps`` and ``hybrid`` only the chief
    returns: worker and ps tasks serve inside the constructor."""
    partitioner = sx.partitioners.MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=2)
    if system in ("ps", "ps-sync"):
        return sx.ParameterServerStrategy(variable_partitioner=partitioner,
                                          mode="sync" if system == "ps-sync" else "async",
                                          timeout_seconds=120)
    if system in ("hybrid", "hybrid-async"):
        return sx.ParameterServerStrategy(variable_partitioner=partitioner,
                                          mode="async" if system == "hybrid-async" else "sync",
                                          dense_variables="workers", timeout_seconds=120)
    if system == "mwms":
        return sx.MultiWorkerMirroredStrategy()
    if system == "one":
        return None
    raise ValueError(f"System {system!r} is not one of this program's: use 'ps', 'hybrid', "
                     "'mwms' or 'one'.")


def train(system: str, root: Path, options: dict[str, Any]) -> None:
    """Builds, trains and scores the model under ``system``'s strategy; prints the result."""
    strategy = make_strategy(system)
    import contextlib

    import jax
    import keras

    on_ps = system in ("ps", "ps-sync", "hybrid", "hybrid-async")
    train_set, held_out = recsys_data.load(root, "train"), recsys_data.load(root, "held_out")
    batch, warm = options["batch"], options["warm_steps"] * options["batch"]
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = recsys_model.build(keras, keras.ops, recsys_data.table_sizes(root))
        checksum = recsys_model.set_initial_weights(model)
        model.compile(**recsys_model.compile_args(keras), steps_per_execution=options["spe"])
    fit = dict(batch_size=batch, epochs=1, shuffle=False, verbose=0)
    model.fit(_inputs(train_set, slice(0, warm)), train_set["labels"][:warm], **fit)
    if on_ps:
        pulled, before = _pulled_bytes(strategy, model), _worker_seconds(strategy)
    start = time.perf_counter()
    history = model.fit(_inputs(train_set), train_set["labels"], **fit)
    wall = time.perf_counter() - start
    steps = -(-len(train_set["labels"]) // batch)
    result = {"system": f"sx-{system}", "examples": len(train_set["labels"]) + warm,
              "timed_examples": len(train_set["labels"]), "steps": steps, "wall_s": wall,
              "examples_per_s": len(train_set["labels"]) / wall,
              "train_loss": float(history.history["loss"][-1]), "weights_checksum": checksum,
              "process": jax.process_index()}
    if on_ps:
        result["ps_bytes_per_step"] = 2 * (_pulled_bytes(strategy, model) - pulled) / steps
        after = _worker_seconds(strategy)
        worker_steps = after["steps"] - before["steps"]
        # Seconds per step of one worker, averaged over the workers' steps of the timed fit.
        result["worker_seconds_per_step"] = {
            k: (after[k] - before[k]) / max(worker_steps, 1) for k in after if k != "steps"}
        result["worker_steps"] = worker_steps
    if system.startswith("hybrid"):
        # Each worker fetches every other worker's gradients of the replicated (non-table)
        # variables each step: (W - 1) x their bytes per worker, W (W - 1) x in all.
        workers = strategy.num_replicas_in_sync
        tables = _table_variables(keras, model)
        dense = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables
                    if id(v) not in tables)
        result.update(workers=workers, dense_bytes=dense,
                      exchange_bytes_per_worker_step=(workers - 1) * dense,
                      exchange_bytes_per_step=workers * (workers - 1) * dense,
                      exchange_s_per_step=result["worker_seconds_per_step"]["exchange"])
    elif system == "mwms":
        result["allreduce_bytes_per_step"] = sum(
            int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    scores = model.predict(_inputs(held_out), batch_size=4096, verbose=0)
    result["auc"] = recsys_data.auc(held_out["labels"], scores)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    train(sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]))
