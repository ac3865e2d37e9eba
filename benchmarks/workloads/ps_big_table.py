"""A table larger than a worker may hold: 4M x 64 float32 (1 GiB) over 2 ps, workers capped.

    python -m benchmarks.workloads.ps_big_table  # 4,000,000 x 64, workers <= 512 MiB
    python -m benchmarks.workloads.ps_big_table --rows 200000 --worker-mib 320 --steps 100
    python -m benchmarks.workloads.ps_big_table --hold-table  # a worker reading it all fails
    python -m benchmarks.workloads.ps_big_table --hybrid \
        --out benchmarks/results/ps_big_table_hybrid.json
    python -m benchmarks.workloads.ps_big_table --keras --chief-mib 640 --ps-mib 900 --steps 40 \
        --out benchmarks/results/ps_big_table_keras.json  # Keras fit, every task capped

Starts chief + 2 workers + 2 ps on 127.0.0.1 (this file is every task's program). The chief
creates the table partitioned in 2 shards (one per ps) and a small dense head, then trains
with the custom loop's row-sparse path (``strategy.read_rows`` + ``apply_gradients``): each
step a worker pulls only the distinct rows its batch looks up (256 x 20 ids, Zipf-distributed
over the table, hot rows spread over both shards) and pushes their gradients.

Each worker process runs under a hard memory cap: ``RLIMIT_DATA`` set before it starts (it
bounds the private writable memory: heap and anonymous mappings, which is what numpy, gRPC
and XLA's buffers use; ``RLIMIT_AS`` cannot be used because XLA reserves large virtual
ranges it never touches). With ``--hold-table`` the step reads the table whole
(``strategy.read``), and the worker fails to pull it under the cap: proof the cap is real.

With ``--keras`` the chief builds a Keras ``Embedding`` model under the strategy's scope and
trains it with ``model.fit(sx.DatasetCreator(dataset_fn))``, then ``evaluate``: the table is
built by its parameter servers from its initializer, shard by shard, so the chief may be capped
below the table's size (``--chief-mib``), and so may each ps (``--ps-mib``, its shards plus
slots plus what the process needs).

Reports each process's peak RSS as the kernel measured it (``ru_maxrss`` from ``wait4``),
steps/s over the timed steps, and the loss of the first and last 20 steps. Prints
``RESULT {json}`` and writes ``benchmarks/results/ps_big_table.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import RESULTS_DIR
from benchmarks.cluster.launch import cluster_spec, drop_page_cache, run_cluster

BATCH, IDS_PER_EXAMPLE, HEAD = 256, 20, 16
STACK_BYTES = 1 << 20


def _args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads.ps_big_table",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300, help="timed steps (scheduled calls)")
    parser.add_argument("--worker-mib", type=int, default=512, help="each worker's memory cap")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                        help="adam keeps 2 slots per row on the ps (3x the ps memory)")
    parser.add_argument("--hold-table", action="store_true",
                        help="read the table whole in the step: the capped worker must fail")
    parser.add_argument("--hybrid", action="store_true",
                        help="hybrid mode: the head replicated on the workers, the table's rows "
                             "updated synchronously (mode='sync', dense_variables='workers')")
    parser.add_argument("--keras", action="store_true",
                        help="Keras fit and evaluate of an Embedding model built under the "
                             "strategy's scope: the table is built by its servers, never on "
                             "the chief")
    parser.add_argument("--chief-mib", type=int, default=0,
                        help="the chief's memory cap (0: none); with --keras below the table")
    parser.add_argument("--ps-mib", type=int, default=0, help="each ps' memory cap (0: none)")
    parser.add_argument("--ps", type=int, default=2, help="parameter servers (and shards)")
    parser.add_argument("--checkpoint", default="",
                        help="with --keras: save a sharded checkpoint here after fit, restore it")
    parser.add_argument("--restore", default="",
                        help="with --keras: restore this checkpoint instead of training")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--out", default=str(RESULTS_DIR / "ps_big_table.json"))
    return parser.parse_args(argv)


# ----- every task: the training program ------------------------------------------------------
ARGS = _args(sys.argv[1:]) if os.environ.get("TF_CONFIG") else None


def dataset_fn(input_context):
    """Runs on each worker (sent by name): Zipf ids scattered over the table, and a label
    that a rule on the ids decides (rows whose id is a multiple of 7 are "liked")."""
    rng = np.random.default_rng(input_context.input_pipeline_id)
    rows = ARGS.rows
    while True:
        rank = np.minimum(rng.zipf(1.1, size=(BATCH, IDS_PER_EXAMPLE)), rows) - 1
        ids = ((rank * 2_654_435_761) % rows).astype(np.int32)    # hot ids on both shards
        labels = ((ids % 7 == 0).sum(axis=1, keepdims=True) >= 1).astype(np.float32)
        yield ids, labels


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def keras_main(strategy, result: dict) -> None:
    """``--keras``: the guide's Keras path for a table the chief cannot hold."""
    import keras

    import stratax as sx

    start = time.perf_counter()
    with strategy.scope():
        ids = keras.Input((IDS_PER_EXAMPLE,), dtype="int32")
        rows = keras.layers.Embedding(ARGS.rows, ARGS.dim, embeddings_initializer=(
            keras.initializers.RandomNormal(stddev=0.05, seed=1)))(ids)
        hidden = keras.layers.Dense(HEAD, activation="relu")(
            keras.layers.GlobalAveragePooling1D()(rows))
        model = keras.Model(ids, keras.layers.Dense(1)(hidden))
        model.compile(optimizer=(keras.optimizers.SGD(0.5) if ARGS.optimizer == "sgd"
                                 else keras.optimizers.Adam(0.01)),
                      loss=keras.losses.BinaryCrossentropy(from_logits=True))
    table = strategy.place_variables(model.layers[1].embeddings)
    result["create_s"] = time.perf_counter() - start
    print(strategy.describe_variables(), flush=True)
    if ARGS.restore:  # another run's checkpoint, written by another number of ps
        result["caches_dropped"] = drop_page_cache()
        begin = time.perf_counter()
        strategy.restore_checkpoint(ARGS.restore, model.variables)  # placed here if need be
        result.update(restore_s=time.perf_counter() - begin,
                      iterations=strategy.optimizer_iterations(table),
                      evaluate_loss=model.evaluate(sx.DatasetCreator(dataset_fn), steps=4,
                                                   verbose=0))
        return
    begin = time.perf_counter()
    history = model.fit(sx.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=ARGS.steps // 2,
                        verbose=0)
    wall = time.perf_counter() - begin
    result.update(steps=ARGS.steps, wall_s=wall, steps_per_s=ARGS.steps / wall,
                  loss_first20=history.history["loss"][0],
                  loss_last20=history.history["loss"][-1],
                  evaluate_loss=model.evaluate(sx.DatasetCreator(dataset_fn), steps=4,
                                               verbose=0),
                  iterations=strategy.optimizer_iterations(table),
                  built_on_servers=type(model.layers[1].embeddings).__name__)
    try:
        model.get_weights()
    except ValueError as err:
        result["get_weights_refused"] = str(err)
    if ARGS.checkpoint:  # every ps writes its shards (values and slots), then reads them back
        begin = time.perf_counter()
        strategy.save_checkpoint(ARGS.checkpoint)
        result["checkpoint_write_s"] = time.perf_counter() - begin
        result["caches_dropped"] = drop_page_cache()  # the restore reads the disk, not the cache
        begin = time.perf_counter()
        strategy.restore_checkpoint(ARGS.checkpoint)
        result["checkpoint_restore_s"] = time.perf_counter() - begin


def task_main() -> None:
    import stratax as sx

    strategy = sx.ParameterServerStrategy(
        variable_partitioner=sx.partitioners.FixedShardsPartitioner(num_shards=ARGS.ps),
        timeout_seconds=60, **({"mode": "sync", "dense_variables": "workers"}
                               if ARGS.hybrid else {}))
    # Only the chief gets here: worker and ps tasks serve inside the constructor.
    import jax
    import jax.numpy as jnp
    import keras

    if ARGS.keras:
        result = {"rows": ARGS.rows, "dim": ARGS.dim, "keras": True, "optimizer": ARGS.optimizer,
                  "table_mib": ARGS.rows * ARGS.dim * 4 / 2**20}
        try:
            keras_main(strategy, result)
        except sx.StrataxError as err:
            result["error"] = str(err)
        result["chief_peak_rss_mib"] = _peak_rss_mib()
        print("RESULT " + json.dumps(result), flush=True)
        return
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    value = rng.standard_normal(size=(ARGS.rows, ARGS.dim), dtype=np.float32)
    value *= 0.05
    table = strategy.create_variable(value, name="embedding")
    del value
    create_s = time.perf_counter() - start
    head = [strategy.create_variable(rng.normal(scale=0.1, size=s).astype(np.float32), name=n)
            for n, s in [("d1/kernel", (ARGS.dim, HEAD)), ("d1/bias", (HEAD,)),
                         ("d2/kernel", (HEAD, 1)), ("d2/bias", (1,))]]
    optimizer = (keras.optimizers.SGD(0.5) if ARGS.optimizer == "sgd"
                 else keras.optimizers.Adam(0.01))

    def loss_fn(rows, params, positions, labels):
        k1, b1, k2, b2 = params
        features = jnp.take(rows, positions, axis=0).mean(axis=1)
        logits = jax.nn.relu(features @ k1 + b1) @ k2 + b2
        # Synchronous (hybrid): the workers' gradients are summed, so each is of its share.
        return jnp.mean(jnp.maximum(logits, 0) - logits * labels
                        + jnp.log1p(jnp.exp(-jnp.abs(logits)))) / strategy.num_replicas_in_sync

    def replica_fn(ids, labels):
        if ARGS.hold_table:
            positions = ids
            rows = strategy.read(table)
            loss, (g_rows, g_head) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
                rows, strategy.read(head), positions, labels)
        else:
            rows, positions = strategy.read_rows(table, ids)
            loss, (g_rows, g_head) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
                rows, strategy.read(head), positions, labels)
        strategy.apply_gradients([(g_rows, table), *zip(g_head, head, strict=True)], optimizer)
        return loss

    def step_fn(iterator):
        loss = strategy.run(replica_fn, args=next(iterator))
        # Synchronous: every worker's share of the loss, summed (else the one worker's).
        return strategy.reduce(sx.ReduceOp.SUM, loss, axis=None) if ARGS.hybrid else loss

    print(strategy.describe_variables(), flush=True)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    result = {"rows": ARGS.rows, "dim": ARGS.dim, "table_mib": ARGS.rows * ARGS.dim * 4 / 2**20,
              "create_s": create_s, "optimizer": ARGS.optimizer, "hold_table": ARGS.hold_table,
              "hybrid": ARGS.hybrid}
    try:
        warm = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(4)]
        coordinator.join()
        begin = time.perf_counter()
        losses = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(ARGS.steps)]
        coordinator.join()
        wall = time.perf_counter() - begin
    except sx.StrataxError as err:
        result["error"] = str(err)
    else:
        values = [float(v.fetch()) for v in [*warm, *losses]]
        result.update(steps=ARGS.steps, wall_s=wall, steps_per_s=ARGS.steps / wall,
                      loss_first20=float(np.mean(values[:20])),
                      loss_last20=float(np.mean(values[-20:])),
                      iterations=strategy.optimizer_iterations(table))
    result["chief_peak_rss_mib"] = _peak_rss_mib()
    print("RESULT " + json.dumps(result), flush=True)


# ----- the launcher --------------------------------------------------------------------------
def _capped(limit: int):
    def apply() -> None:
        # RLIMIT_DATA counts reserved private memory, thread stacks included: with glibc's
        # default 8 MiB stacks (from RLIMIT_STACK) gRPC's and XLA's threads alone would use
        # the cap, so threads get 1 MiB stacks.
        resource.setrlimit(resource.RLIMIT_STACK, (STACK_BYTES, STACK_BYTES))
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return apply


def launch(args: argparse.Namespace, argv: list[str]) -> dict:
    """Runs the cluster once; returns the chief's result plus every task's peak RSS."""
    run = run_cluster([sys.executable, str(Path(__file__).resolve()), *argv],
                      cluster_spec(workers=2, ps=args.ps), args.timeout,
                      preexec={"worker": _capped(args.worker_mib << 20),
                               **({"chief": _capped(args.chief_mib << 20)}
                                  if args.chief_mib else {}),
                               **({"ps": _capped(args.ps_mib << 20)} if args.ps_mib else {})},
                      log_prefix="ps_big_table_")
    result = run.result()
    result.update(worker_cap_mib=args.worker_mib, chief_cap_mib=args.chief_mib,
                  ps_cap_mib=args.ps_mib, peak_rss_mib=run.peak_rss_mib,
                  exit_codes=run.exit_codes, load_average=os.getloadavg(), logs=str(run.log_dir))
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _args(argv)
    result = launch(args, argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    if os.environ.get("TF_CONFIG"):
        task_main()
    else:
        sys.exit(main())
