"""Cost of watching a run: training throughput with and without stratax's observe callbacks.

Side by side, each run in a fresh process, the variants of one repetition run back to back
(interleaved, so machine load hits them alike), median [min-max] of ``--reps`` repetitions:

- one process (``sx.MirroredStrategy()``, 1 CPU device): no callback; ``WorkerMetrics``
  (default 1 s windows); ``TensorBoard`` (epoch-level scalars, Keras' default ``update_freq``);
- two worker processes on 127.0.0.1 (``MultiWorkerMirroredStrategy`` through TF_CONFIG, process i
  pinned to core i): no callback; ``WorkerMetrics`` on every worker.

Workload: the suite's MLP 784->128->10, global batch 256, Adam, ``steps_per_execution`` 1 (the
per-step cost of the callback is largest there), 100 steps per epoch on fixed random data;
samples/s = samples per epoch / median epoch time over epochs 2..E (epoch 1 compiles).
Also samples per CPU-second of the process (``time.process_time``, all its threads): on a
machine shared with other work, wall-clock rates move with the neighbours' load far more than
by 2%, while the CPU time the training process itself spends per sample barely does; the
overhead of a callback is the extra CPU it costs.
Run: ``python -m benchmarks.workloads.observe_overhead [--reps 5]``; writes
``benchmarks/results/observe_overhead.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import REPO_ROOT, RESULTS_DIR
from benchmarks.cluster.launch import free_ports

RESULTS = RESULTS_DIR
GLOBAL_BATCH = 256
STEPS_PER_EPOCH = 100
EPOCHS = {"1proc": 12, "2proc": 6}
VARIANTS = {"1proc": ("none", "worker_metrics", "tensorboard"),
            "2proc": ("none", "worker_metrics")}
# ``--diagnose``: WorkerMetrics with one suspect removed at a time (the all-reduce probe at the
# start of ``fit``; the wait for the step in flight that closes each 1 s window).
DIAGNOSTIC_VARIANTS = ("worker_metrics_no_probe", "worker_metrics_no_window_wait")
RUN_TIMEOUT_S = 300


def _child(variant: str, epochs: int, out_dir: str, pin: bool) -> None:
    """One training run; prints ``RESULT {json}`` on worker 0."""
    if pin:
        index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
        os.sched_setaffinity(0, {index % os.cpu_count()})
    import stratax as sx  # first: selects Keras' JAX backend  # isort: skip
    import keras
    import numpy as np

    multi = "TF_CONFIG" in os.environ
    strategy = (sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=120))
        if multi else sx.MirroredStrategy())
    rng = np.random.default_rng(0)
    n = GLOBAL_BATCH * STEPS_PER_EPOCH
    x = rng.standard_normal((n, 784), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

            self.cpu: list[float] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_epoch_end(self, epoch, logs=None):
            self.times.append(time.perf_counter() - self.start)
            self.cpu.append(time.process_time() - self.cpu_start)

    timer = EpochTimer()
    callbacks = [timer]
    if variant == "worker_metrics":
        callbacks.append(sx.callbacks.WorkerMetrics(out_dir))
    elif variant == "worker_metrics_no_probe":
        callbacks.append(sx.callbacks.WorkerMetrics(out_dir, probe_repeats=0))
    elif variant == "worker_metrics_no_window_wait":  # windows close only at epoch ends
        callbacks.append(sx.callbacks.WorkerMetrics(out_dir, every_seconds=1e9))
    elif variant == "tensorboard":
        callbacks.append(sx.callbacks.TensorBoard(os.path.join(out_dir, "tb")))
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=callbacks)
    if strategy.is_chief:
        print("RESULT " + json.dumps({
            "samples_per_s": n / statistics.median(timer.times[1:]),
            "samples_per_cpu_s": n / statistics.median(timer.cpu[1:]),
            "final_loss": float(history.history["loss"][-1])}), flush=True)


def _run(kind: str, variant: str) -> dict[str, float]:
    """Runs one configuration in fresh process(es); returns worker 0's RESULT."""
    epochs = EPOCHS[kind]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAX_")}
    env.pop("TF_CONFIG", None)
    nproc = 2 if kind == "2proc" else 1
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(nproc)]}
    with tempfile.TemporaryDirectory(prefix="observe-overhead-") as out_dir:
        procs = []
        for index in range(nproc):
            child_env = dict(env)
            if nproc > 1:
                child_env["TF_CONFIG"] = json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}})
            command = [sys.executable, "-m", "benchmarks.workloads.observe_overhead",
                       "--child", variant,
                       "--epochs", str(epochs), "--out", out_dir]
            if nproc > 1:
                command.append("--pin")
            procs.append(subprocess.Popen(command, env=child_env, text=True,
                                          cwd=REPO_ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          start_new_session=True))
        outputs = []
        try:
            for proc in procs:
                out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
                if proc.returncode != 0:
                    raise RuntimeError(f"{kind}/{variant} worker exited {proc.returncode}:\n"
                                       f"{err[-2000:]}")
                outputs.append(out)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, 9)
                    proc.wait(timeout=10)
    lines = [line for out in outputs for line in out.splitlines() if line.startswith("RESULT ")]
    if len(lines) != 1:
        raise RuntimeError(f"{kind}/{variant}: expected one RESULT line, got {len(lines)}")
    return json.loads(lines[0][len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads.observe_overhead",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", choices=sorted(VARIANTS), default=None)
    parser.add_argument("--diagnose", action="store_true",
                        help="2 processes: also WorkerMetrics without its all-reduce probe, and "
                             "without its per-window wait")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.epochs, args.out, args.pin)
        return 0
    if args.reps < 3:
        parser.error(f"--reps {args.reps}: need at least 3 for a median with min/max")
    kinds = [args.only] if args.only else list(VARIANTS)
    variants = {k: VARIANTS[k] + (DIAGNOSTIC_VARIANTS if args.diagnose and k == "2proc" else ())
                for k in kinds}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        k: {v: [] for v in variants[k]} for k in kinds}
    for rep in range(args.reps):
        for kind in kinds:
            for variant in variants[kind]:
                result = _run(kind, variant)
                runs[kind][variant].append(result)
                print(f"rep {rep + 1}/{args.reps} {kind:5s} {variant:15s} "
                      f"{result['samples_per_s']:>10,.0f} samples/s "
                      f"{result['samples_per_cpu_s']:>10,.0f} samples/cpu-s", flush=True)
    _write(runs, args.reps)
    return 0


def _per_step_cost(reps: int, steps: int = 20_000) -> dict[str, float]:
    """Host microseconds ``WorkerMetrics`` adds to one step, outside its once-per-window wait.

    Times ``steps`` calls of a no-op train function (it only takes the next batch, a numpy
    array of 256 rows, from the iterator) directly and as the callback leaves it on the model:
    through Keras' callback protocol (``set_model``, ``on_train_begin``), the callback wraps
    ``model.train_function``, as it does in ``fit``; a window too long to close, the first
    (untimed, compiling) call made before the timing. Median over ``reps`` repetitions of the
    difference per step.
    """
    import stratax as sx  # first: selects Keras' JAX backend  # isort: skip
    import keras
    import numpy as np

    batch = np.zeros((GLOBAL_BATCH, 784), np.float32)

    def no_op_step(state, iterator):
        return {"loss": next(iterator)}, state

    with sx.OneDeviceStrategy("cpu:0").scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
    costs = []
    with tempfile.TemporaryDirectory(prefix="observe-overhead-") as out_dir:
        callback = sx.callbacks.WorkerMetrics(out_dir, task="micro", every_seconds=1e9)
        model.train_function = no_op_step
        callback.set_model(model)
        callback.on_train_begin()
        timed = model.train_function
        if timed is no_op_step:
            raise RuntimeError("WorkerMetrics no longer wraps model.train_function in "
                               "on_train_begin: this measurement needs another way in")
        timed(None, iter([(batch,)]))  # the first call is the compiling one: not timed
        for _ in range(reps):
            data = iter([(batch,)] * steps)
            start = time.perf_counter()
            for _ in range(steps):
                no_op_step(None, data)
            bare = time.perf_counter() - start
            data = iter([(batch,)] * steps)
            start = time.perf_counter()
            for _ in range(steps):
                timed(None, data)
            wrapped = time.perf_counter() - start
            costs.append((wrapped - bare) / steps * 1e6)
        callback.on_train_end()
        callback.writer.close()
    return {"us_per_step_median": statistics.median(costs), "min": min(costs), "max": max(costs)}


def _write(runs: dict[str, dict[str, list[dict[str, float]]]], reps: int) -> None:
    import stratax  # noqa: F401  # isort: skip  (selects Keras' JAX backend)
    import jax
    import keras

    rows = ["| configuration | callback | measure | median [min-max] | ratio of medians to no "
            "callback | paired overhead, median of reps |",
            "| --- | --- | --- | --- | --- | --- |"]
    summary: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for kind, variants in runs.items():
        label = {"1proc": "1 process, MirroredStrategy (1 CPU)",
                 "2proc": "2 processes x 1 core, MultiWorkerMirrored"}[kind]
        for variant, results in variants.items():
            for measure in ("samples_per_s", "samples_per_cpu_s"):
                base = [r[measure] for r in variants["none"]]
                rates = [r[measure] for r in results]
                ratio = statistics.median(rates) / statistics.median(base)
                paired = statistics.median(1 - r / b for r, b in zip(rates, base, strict=True))
                summary.setdefault(kind, {}).setdefault(variant, {})[measure] = {
                    "median": statistics.median(rates), "min": min(rates), "max": max(rates),
                    "ratio": ratio, "paired_overhead": paired}
                rows.append(f"| {label} | {variant} | {measure.replace('_', ' ')} | "
                            f"{statistics.median(rates):,.0f} [{min(rates):,.0f}-"
                            f"{max(rates):,.0f}] | {ratio:.3f} | "
                            + ("-" if variant == "none" else f"{100 * paired:+.1f}%") + " |")
    micro = _per_step_cost(reps)
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"reps": reps, "python": platform.python_version(), "jax": jax.__version__,
            "keras": keras.__version__, "cpus": os.cpu_count(),
            "load_avg_at_end": os.getloadavg(), "workload": "mlp 784-128-10, batch 256, spe 1",
            "steps_per_epoch": STEPS_PER_EPOCH, "epochs": EPOCHS}
    (RESULTS / "observe_overhead.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "per_step_cost": micro, "runs": runs},
                   indent=1))
    text = ("# Overhead of the observe callbacks\n\n"
            f"`python -m benchmarks.workloads.observe_overhead --reps {reps}`; {reps} repetitions, "
            "each configuration in fresh processes, variants interleaved within a repetition. "
            "Paired overhead: 1 - rate/rate(no callback) within each repetition, median. "
            f"Load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.\n\n"
            + "\n".join(rows) + "\n\n"
            f"Host cost WorkerMetrics adds to each step (its wrapper and timed iterator, a no-op "
            f"step, median of {reps}): {micro['us_per_step_median']:.2f} us "
            f"[{micro['min']:.2f}-{micro['max']:.2f}]; plus one wait for the step in flight per "
            f"1 s window.\n")
    (RESULTS / "observe_overhead.md").write_text(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
