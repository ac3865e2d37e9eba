"""Lazy vs dense Adam on row-sparse embedding gradients: convergence, measured (one process).

The parameter server's two semantics for Adam with row-sparse gradients (see
``stratax/_src/parameter_server/tasks/optimizers.py``), applied by the ps' own optimizer code to the
same synthetic task: learn a 20,000 x 16 embedding table so that the mean of each example's
20 rows predicts its target through a fixed linear head (targets from a hidden true table; ids
Zipf-distributed, as in recommender data). Reports the training loss every 200 steps, the
final loss on fresh batches, and ps time per update.

    python -m benchmarks.internals.ps_sparse_adam  # writes benchmarks/results/ps_sparse_adam.md
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks import RESULTS_DIR
from benchmarks.harness.report import write_table
from stratax._src.parameter_server.tasks.optimizers import ShardOptimizer

VOCAB, DIM, IDS, BATCH, STEPS = 20_000, 16, 20, 256, 2000
RESULTS = RESULTS_DIR


def _batches(rng, true_table, head, steps):
    for _ in range(steps):
        ids = np.minimum(rng.zipf(1.3, size=(BATCH, IDS)) - 1, VOCAB - 1)
        y = true_table[ids].mean(axis=1) @ head
        yield ids, y


def _step(table, ids, y, head):
    """Loss and row-sparse gradient (distinct rows, their gradients) of 0.5 * mean sq. error."""
    emb = table[ids].mean(axis=1)
    err = emb @ head - y
    loss = 0.5 * float(np.mean(err ** 2))
    d_emb = (err[:, None] * head[None, :]) / len(y) / IDS  # d loss / d each looked-up row
    unique, inverse = np.unique(ids.reshape(-1), return_inverse=True)
    grad = np.zeros((unique.size, DIM), np.float32)
    np.add.at(grad, inverse, np.repeat(d_emb, IDS, axis=0))
    return loss, unique, grad


def run(mode: str, lr: float) -> dict:
    rng = np.random.default_rng(0)
    true_table = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    head = rng.normal(size=(DIM,)).astype(np.float32)
    table = np.zeros((VOCAB, DIM), np.float32)
    opt = ShardOptimizer({"class_name": "Adam", "config": {"learning_rate": lr}}, table, mode)
    curve, apply_s = [], 0.0
    for step, (ids, y) in enumerate(_batches(np.random.default_rng(1), true_table, head, STEPS)):
        loss, rows, grad = _step(table, ids, y, head)
        start = time.perf_counter()
        opt.apply_rows(table, rows, grad)
        apply_s += time.perf_counter() - start
        if step % 200 == 0 or step == STEPS - 1:
            curve.append((step, loss))
    held_out = [_step(table, ids, y, head)[0]
                for ids, y in _batches(np.random.default_rng(2), true_table, head, 50)]
    return {"mode": mode, "lr": lr, "curve": curve, "final_loss": float(np.mean(held_out)),
            "ms_per_update": 1000 * apply_s / STEPS}


def main() -> None:
    results = [run(mode, lr) for lr in (0.01, 0.05) for mode in ("lazy", "dense")]
    lines = ["# Lazy vs dense Adam on row-sparse embedding gradients", "",
             (f"Table {VOCAB} x {DIM}, batch {BATCH} x {IDS} Zipf(1.3) ids, {STEPS} steps, "
              "one process, the parameter server's optimizer code."), "",
             ("| Adam lr | sparse_updates | loss at step 0 / 200 / 1000 / last | held-out loss | "
              "ps ms per update |"), "| --- | --- | --- | --- | --- |"]
    for r in results:
        points = dict(r["curve"])
        picked = " / ".join(f"{points[s]:.4f}" for s in (0, 200, 1000, STEPS - 1))
        lines.append(f"| {r['lr']} | {r['mode']} | {picked} | {r['final_loss']:.4f} | "
                     f"{r['ms_per_update']:.2f} |")
    write_table(RESULTS, "ps_sparse_adam", lines, results)


if __name__ == "__main__":
    main()
