"""Side-by-side benchmarks of stratax against its peers (TensorFlow ``tf.distribute``, Keras 3).

Every configuration (one system, one workload, one ``steps_per_execution``) runs in a fresh
child interpreter, several times, on the same synthetic data, initial weights and global batch.
The parent process only plans, launches, times out and reports; it never imports a framework.

Entry point::

    python -m benchmarks run --quick            # every benchmark, short runs, 3 repetitions
    python -m benchmarks run --only mirrored    # one named benchmark
    python -m benchmarks run --dry-run          # validate the plan, run nothing

See ``benchmarks/README.md`` for what each number means and how it is measured.
"""

from __future__ import annotations

from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
CACHE_DIR = BENCH_DIR / ".cache"
VENV_DIR = BENCH_DIR / ".venvs"
CLUSTER_DIR = BENCH_DIR / "cluster"  # programs started as processes: one per task
PEERS_DIR = BENCH_DIR / "peers"  # the peers' programs (TensorFlow, PyTorch)
