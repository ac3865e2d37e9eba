"""stratax's tasks in ``benchmarks.recsys``: the DLRM model under ParameterServerStrategy or
MultiWorkerMirroredStrategy, trained with ``model.fit`` on the same arrays.

argv: ``ps`` or ``mwms``, the data directory (``recsys_data.ensure``), a JSON of options
(``batch``: global batch, ``warm_steps``: batches of the untimed first ``fit`` that compiles
the step, ``spe``: ``steps_per_execution``).

- ``ps``: every task of a chief + workers + ps cluster on 127.0.0.1 runs this file with its
  TF_CONFIG (``benchmarks.cluster`` starts them); workers and ps serve inside the strategy's
  constructor. The 26 ``Embedding`` tables take the row-sparse path; tables of 256 KiB or more
  are split over 2 ps (``MinSizePartitioner``, as TF's program does).
- ``mwms``: each process of ``stratax launch --workers 2`` runs it; every table is replicated
  and its (dense) gradient all-reduced.

Both train on the warm-up batches, then on the whole training set (timed, 1 epoch, no
shuffle), predict the held-out set and print ``RESULT {json}`` (the chief, or every MWMS
process, with its own peak RSS).
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
from benchmarks import recsys_data, recsys_model


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


def train(system: str, root: Path, options: dict[str, Any]) -> None:
    """Builds, trains and scores the model under ``system``'s strategy; prints the result."""
    if system == "ps":
        strategy = sx.ParameterServerStrategy(
            variable_partitioner=sx.partitioners.MinSizePartitioner(
                min_shard_bytes=256 << 10, max_shards=2),
            timeout_seconds=120)
        # Only the chief gets here: worker and ps tasks serve inside the constructor.
    elif system == "mwms":
        strategy = sx.MultiWorkerMirroredStrategy()
    else:
        raise ValueError(f"System {system!r} is not one of this program's: use 'ps' or 'mwms'.")
    import jax
    import keras

    train_set, held_out = recsys_data.load(root, "train"), recsys_data.load(root, "held_out")
    batch, warm = options["batch"], options["warm_steps"] * options["batch"]
    with strategy.scope():
        model = recsys_model.build(keras, keras.ops, recsys_data.table_sizes(root))
        checksum = recsys_model.set_initial_weights(model)
        model.compile(**recsys_model.compile_args(keras), steps_per_execution=options["spe"])
    fit = dict(batch_size=batch, epochs=1, shuffle=False, verbose=0)
    model.fit(_inputs(train_set, slice(0, warm)), train_set["labels"][:warm], **fit)
    pulled = _pulled_bytes(strategy, model) if system == "ps" else None
    start = time.perf_counter()
    history = model.fit(_inputs(train_set), train_set["labels"], **fit)
    wall = time.perf_counter() - start
    steps = -(-len(train_set["labels"]) // batch)
    result = {"system": f"sx-{system}", "examples": len(train_set["labels"]) + warm,
              "timed_examples": len(train_set["labels"]), "steps": steps, "wall_s": wall,
              "examples_per_s": len(train_set["labels"]) / wall,
              "train_loss": float(history.history["loss"][-1]), "weights_checksum": checksum,
              "process": jax.process_index()}
    if system == "ps":
        result["ps_bytes_per_step"] = 2 * (_pulled_bytes(strategy, model) - pulled) / steps
    else:
        result["allreduce_bytes_per_step"] = sum(
            int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    scores = model.predict(_inputs(held_out), batch_size=4096, verbose=0)
    result["auc"] = recsys_data.auc(held_out["labels"], scores)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    train(sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]))
