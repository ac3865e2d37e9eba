"""The program every file in ``examples/deploy/`` runs: a digits classifier, any cluster.

One program for a laptop, Kubernetes and Slurm. It never says where it runs: the strategy reads
the cluster from the environment (``stratax launch``, ``TF_CONFIG`` from a Kubeflow TFJob, an
Indexed Job or JobSet's ``JOB_COMPLETION_INDEX``, Slurm's ``SLURM_*``), see docs/deploy.md::

    stratax launch --nproc-per-node 2 examples/deploy/train.py --backup-dir /tmp/sx-backup
    python examples/deploy/train.py                      # one process

``--strategy parameter_server`` makes this the chief of a parameter-server cluster (the ps and
worker tasks run ``stratax server``; synchronous mode, so the result equals one process).

With ``--backup-dir`` (a folder every worker shares, e.g. a PersistentVolumeClaim),
``sx.BackupAndRestore`` saves every ``--save-freq`` steps; on SIGTERM (preemption) all workers
save at one step and exit with code 42, and the restarted job resumes there. With ``--output``
the chief writes the final weights (``weights.npz``) and the model (``model.keras``). Every
worker prints one JSON line: its task, the replica count and a digest of its final weights,
the same on every worker.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import stratax as sx  # first: selects Keras' JAX backend (imports neither JAX nor Keras yet)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=("multi_worker_mirrored", "parameter_server"),
                        default="multi_worker_mirrored")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64,
                        help="GLOBAL batch size, split over all workers (default: 64)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--backup-dir", default=None,
                        help="shared folder for sx.BackupAndRestore (resume after preemption)")
    parser.add_argument("--save-freq", type=int, default=10,
                        help="steps between backups (default: 10)")
    parser.add_argument("--output", default=None,
                        help="folder where the chief writes weights.npz and model.keras")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds any collective or start-up wait may take (default: 120)")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.save_freq < 1:
        parser.error("--epochs, --batch-size and --save-freq must be positive")
    return args


def make_strategy(name: str, timeout: float):
    if name == "parameter_server":
        # TF_CONFIG names this task 'chief'; the ps and worker tasks serve (`stratax server`).
        return sx.ParameterServerStrategy(sx.cluster_resolver.TFConfigClusterResolver(),
                                          mode="sync")
    return sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=timeout))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    strategy = make_strategy(args.strategy, args.timeout)  # before anything starts JAX

    import keras  # after the strategy: a bad flag or cluster fails before the import
    import numpy as np

    from stratax.datasets import load_digits

    (x, y), (x_test, y_test) = load_digits()
    # Whole global batches only: a synchronous parameter-server step splits every batch over
    # the workers, and every strategy then sees the same batches.
    x, y = _whole_batches(x, y, args.batch_size)
    x_test, y_test = _whole_batches(x_test, y_test, args.batch_size)

    keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((x.shape[1],)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = []
    if args.backup_dir:
        callbacks.append(sx.BackupAndRestore(args.backup_dir, save_freq=args.save_freq))
    history = model.fit(x, y, epochs=args.epochs, batch_size=args.batch_size, shuffle=True,
                        callbacks=callbacks, verbose=2 if _is_chief(strategy) else 0)
    _, accuracy = model.evaluate(x_test, y_test, batch_size=args.batch_size, verbose=0)

    weights = model.get_weights()
    digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights))
    if args.output and _is_chief(strategy):
        _save(model, weights, args.output)
    resolver = getattr(strategy, "cluster_resolver", None)
    print(json.dumps({
        "resolver": type(resolver).__name__,
        "task": [getattr(resolver, "task_type", None), getattr(resolver, "task_id", None)],
        "replicas": strategy.num_replicas_in_sync,
        "chief": _is_chief(strategy),
        "loss": [float(v) for v in history.history["loss"]],
        "test_accuracy": float(accuracy),
        "weights_sha256": digest.hexdigest(),
    }), flush=True)
    return 0


def _whole_batches(x, y, batch_size: int):
    rows = len(x) // batch_size * batch_size
    return x[:rows], y[:rows]


def _is_chief(strategy) -> bool:
    return bool(getattr(strategy, "is_chief", True))


def _save(model, weights, output: str) -> None:
    """Writes weights.npz and model.keras into ``output``, each atomically (temp + rename)."""
    import numpy as np

    os.makedirs(output, exist_ok=True)
    temporary = os.path.join(output, ".weights.tmp.npz")
    np.savez(temporary, *weights)
    os.replace(temporary, os.path.join(output, "weights.npz"))
    temporary = os.path.join(output, ".model.tmp.keras")
    model.save(temporary)
    os.replace(temporary, os.path.join(output, "model.keras"))


if __name__ == "__main__":
    sys.exit(main())
