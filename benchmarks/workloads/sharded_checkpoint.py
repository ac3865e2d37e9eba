"""Checkpoints of state held in parts by 2 processes: ``sx.BackupAndRestore`` against Orbax.

Two processes (``sx.MultiWorkerMirroredStrategy`` from TF_CONFIG on 127.0.0.1, 2 CPU devices
each through ``STRATAX_CPU_DEVICES``; one replica over the 4 devices, ``cores_per_replica=4``)
hold a model of 4 ``Dense`` kernels, ``--mib`` MiB of float32 noise in all, each kernel's rows
split over the 4 devices by a ``layout_map``: each process holds half of every kernel and no
process holds one whole. Each writer saves that state (every process its own parts), the page
cache is dropped where this process may (root), then both processes restore it into another
model whose kernels are split by columns (every process reads parts of the other's files),
and check every value of their parts:

- ``stratax``: ``sx.BackupAndRestore(save_freq="epoch", save_in_background=False)`` in a
  ``fit`` of one step (``SGD(0)``, so the state stays the known noise); timed from the
  epoch's end (a callback before the backup's) until ``fit`` returned in every process.
  Restored by a fresh ``BackupAndRestore`` on the same directory in the other model's ``fit``,
  timed from the ``fit`` call until the backup's ``on_train_begin`` (which restores) is done;
  ``fit`` then trains nothing (the epoch is done).
- ``orbax``: ``orbax.checkpoint.StandardCheckpointer`` ``save`` + ``wait_until_finished`` of
  the same variables' arrays (``{variable.path: variable.value}``, the optimizer's too), and
  ``restore`` with the other model's shardings, then ``assign`` (tensorstore underneath).

Reported per writer, median of ``--reps`` fresh process pairs run alternately: save and
restore wall seconds (the slower process), the peak RSS an operation adds in a process
(``VmHWM`` reset to ``VmRSS`` before it; the restoring model's own state is in its base),
files and bytes on disk; plus Orbax's import time in a process that already imported JAX, and
its install size (``--orbax-site``: the site-packages of an environment holding only what Orbax
adds to one with JAX, NumPy and tensorstore). Only stratax's public API.

Run: ``python -m benchmarks.workloads.sharded_checkpoint [--mib 200 --reps 3 --python PY]``
with ``PY`` an interpreter that can import ``orbax.checkpoint`` (its rows say ``not
installed`` otherwise); ``--dry-run`` prints the plan; writes
``benchmarks/results/sharded_checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import REPO_ROOT, RESULTS_DIR

WRITERS = ("stratax", "orbax")
ROWS, KERNELS, BATCH = 4096, 4, 8
MEASURES = ("save_s", "restore_s", "save_rss_mib", "restore_rss_mib", "held_mib")


def _columns(mib: int) -> int:
    """Columns of each of the 4 kernels (``ROWS`` rows each) so that together they are
    ``mib`` MiB of float32."""
    if mib < 1:
        raise ValueError(f"--mib must be at least 1, got {mib}")
    columns = mib * 2**20 // KERNELS // 4 // ROWS
    return columns - columns % 4  # split evenly over 4 devices either way


def _status_mib(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of this process, in MiB."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def _peak_from_here() -> float:
    """Resets this process's peak RSS to its current RSS (Linux ``clear_refs``); returns the
    current RSS in MiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


def _noise(index: int, shape: tuple[int, int], where: Any = ()) -> Any:
    """Kernel ``index``'s known values (noise, as trained weights are: no compression wins), a
    function of the position; ``where`` selects a part (a shard's index)."""
    import numpy as np

    r = np.arange(shape[0], dtype=np.float64)[where[0] if where else slice(None), None]
    c = np.arange(shape[1], dtype=np.float64)[where[1] if where else slice(None)][None]
    return (np.sin(r * 12.9898 + c * 78.233 + index) * 43758.5453 % 1).astype(np.float32)


def _worker(writer: str, directory: str, mib: int) -> dict[str, Any]:
    """One process of a pair: builds its half of the state, saves, restores, checks."""
    import stratax as sx  # first: selects Keras' JAX backend  # isort: skip
    import jax
    import keras
    import numpy as np
    from jax.experimental import multihost_utils

    def build(split: tuple[str | None, str | None]) -> Any:
        layout = keras.distribution.LayoutMap(None)
        layout[".*kernel"] = split
        strategy = sx.MultiWorkerMirroredStrategy(
            cores_per_replica=4, layout_map=layout,
            communication_options=sx.CommunicationOptions(timeout_seconds=600))
        with strategy.scope():
            inputs = keras.Input((ROWS,))
            outputs = keras.layers.Add()([
                keras.layers.Dense(columns, use_bias=False, name=f"kernel{i}")(inputs)
                for i in range(KERNELS)])
            model = keras.Model(inputs, outputs)
            model.compile(optimizer=keras.optimizers.SGD(0.0, name="sgd"), loss="mse")
        return model

    def state(model: Any) -> list[Any]:
        return [*model.variables, *model.optimizer.variables]

    barriers = iter(range(100))

    def barrier() -> None:
        multihost_utils.sync_global_devices(f"sharded-checkpoint-{next(barriers)}")

    columns = _columns(mib)
    shape = (ROWS, columns)
    x, y = np.zeros((BATCH, ROWS), np.float32), np.zeros((BATCH, columns), np.float32)
    model = build(("core", None))  # rows split over the 4 devices of both processes
    model.set_weights([_noise(i, shape) for i in range(KERNELS)])
    model.optimizer.build(model.trainable_variables)
    held = sum(s.data.nbytes for v in state(model) for s in v.value.addressable_shards)
    if any(v.value.is_fully_addressable for v in model.trainable_variables):
        raise RuntimeError("a kernel is held whole by one process: the layout did not split it")
    result: dict[str, Any] = {"held_mib": held / 2**20}
    if writer == "orbax":
        start = time.perf_counter()
        import orbax.checkpoint as ocp
        result["import_s"] = time.perf_counter() - start
        checkpointer = ocp.StandardCheckpointer()
        target = os.path.join(directory, "ckpt")
    barrier()
    marks: dict[str, float] = {}
    if writer == "stratax":
        clock = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: marks.update(
            base=_peak_from_here(), start=time.perf_counter()))
        backup = sx.BackupAndRestore(directory, save_freq="epoch", delete_checkpoint=False,
                                     save_in_background=False)
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[clock, backup])
    else:
        marks.update(base=_peak_from_here(), start=time.perf_counter())
        checkpointer.save(target, {v.path: v.value for v in state(model)})
        checkpointer.wait_until_finished()
    barrier()
    result["save_s"] = time.perf_counter() - marks["start"]
    result["save_rss_mib"] = _status_mib("VmHWM") - marks["base"]
    del model
    if jax.process_index() == 0:
        result["dropped_cache"] = _drop_page_cache()
        files = [p for p in Path(directory).rglob("*") if p.is_file()]
        result["files"], result["disk_mib"] = len(files), sum(
            p.stat().st_size for p in files) / 2**20
    other = build((None, "core"))  # columns split: each process reads parts of both's files
    other.optimizer.build(other.trainable_variables)
    barrier()
    base, start = _peak_from_here(), time.perf_counter()
    if writer == "stratax":
        clock = keras.callbacks.LambdaCallback(on_train_begin=lambda logs: marks.update(
            restored=time.perf_counter()))
        backup = sx.BackupAndRestore(directory, delete_checkpoint=False)
        other.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[backup, clock])
        if "restored" not in marks:
            raise RuntimeError("fit did not call on_train_begin")
    else:
        abstract = {v.path: jax.ShapeDtypeStruct(v.shape, v.value.dtype,
                                                 sharding=v.value.sharding)
                    for v in state(other)}
        restored = checkpointer.restore(target, abstract)
        for v in state(other):
            v.assign(restored[v.path])
        jax.block_until_ready([v.value for v in state(other)])
        marks["restored"] = time.perf_counter()
    barrier()
    result["restore_s"] = marks["restored"] - start
    result["restore_rss_mib"] = _status_mib("VmHWM") - base
    for i, variable in enumerate(other.trainable_variables):
        value = variable.value
        if value.is_fully_addressable:
            raise RuntimeError(f"{writer} restored {variable.path} whole into one process")
        for shard in value.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), _noise(i, shape, shard.index),
                                          err_msg=f"{writer}: {variable.path}")
    barrier()
    return result


def _drop_page_cache() -> bool:
    from benchmarks.cluster.launch import drop_page_cache

    return drop_page_cache()


def _pair(python: str, writer: str, mib: int) -> dict[str, Any]:
    """Runs one fresh pair of processes for ``writer``; returns the slower process's times
    and the larger peak memory."""
    from benchmarks.cluster.launch import free_ports

    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    directory = tempfile.mkdtemp(prefix=f"sharded-ckpt-{writer}-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAX_")
           and k not in ("TF_CONFIG", "XLA_FLAGS")}
    env.update(STRATAX_CPU_DEVICES="2", PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([python, "-m", "benchmarks.workloads.sharded_checkpoint",
                               "--worker", writer, directory, str(mib)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, "TF_CONFIG": json.dumps(
                                  {"cluster": cluster, "task": {"type": "worker", "index": i}})},
                              cwd=REPO_ROOT, start_new_session=True)
             for i in range(2)]
    try:
        outs = [p.communicate(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        shutil.rmtree(directory, ignore_errors=True)
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            if "No module named 'orbax'" in err:
                return {"error": "not installed"}
            raise RuntimeError(f"{writer} worker failed ({p.returncode}):\n{err[-3000:]}")
    return _merge([json.loads(out.strip().splitlines()[-1]) for out, _ in outs])


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One pair's figures: the slower process's times, the larger memory, process 0's files."""
    merged = {k: max(r[k] for r in results) for k in MEASURES}
    merged.update({k: results[0][k] for k in ("files", "disk_mib", "dropped_cache")})
    if "import_s" in results[0]:
        merged["import_s"] = max(r["import_s"] for r in results)
    return merged


def _rows(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per writer: the median of each figure over its pairs, or the error of its first."""
    rows = {}
    for writer, results in runs.items():
        if any("error" in r for r in results):
            rows[writer] = {"error": next(r["error"] for r in results if "error" in r)}
            continue
        rows[writer] = {k: statistics.median(r[k] for r in results) for k in results[0]
                        if k != "dropped_cache"}
        rows[writer]["dropped_cache"] = all(r["dropped_cache"] for r in results)
    return rows


def _site_mib(site: str | None) -> float | None:
    """MiB of the packages in ``site`` (a virtual environment's site-packages holding Orbax
    and what it adds), pip and setuptools left out."""
    if not site:
        return None
    total = 0
    for entry in Path(site).iterdir():
        if entry.name.startswith(("pip", "setuptools", "_distutils", "pkg_resources",
                                  "distutils-")):
            continue
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        total += sum(p.stat().st_size for p in files)
    return total / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workloads.sharded_checkpoint",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--python", default=sys.executable,
                        help="an interpreter that imports orbax.checkpoint and stratax")
    parser.add_argument("--orbax-site", default=None,
                        help="site-packages of a venv holding only Orbax and its additions")
    parser.add_argument("--out", default=str(RESULTS_DIR / "sharded_checkpoint.json"))
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)
    columns = _columns(args.mib)
    plan = [(f"rep {rep + 1}/{args.reps}: {writer}, 2 processes x 2 CPU devices, {KERNELS} "
             f"kernels {ROWS} x {columns} float32 ({KERNELS * ROWS * columns * 4 / 2**20:.0f} "
             "MiB), saved split by rows, restored split by columns", writer)
            for rep in range(args.reps) for writer in WRITERS]
    if args.dry_run:
        print("\n".join(line for line, _ in plan))
        return 0
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in WRITERS}
    for line, writer in plan:
        runs[writer].append(_pair(args.python, writer, args.mib))
        print(line, runs[writer][-1], flush=True)
    report = {"command": "python -m benchmarks.workloads.sharded_checkpoint " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "date": time.strftime("%Y-%m-%d"), "load_before": os.getloadavg()[0],
              "mib": args.mib, "reps": args.reps, "writers": _rows(runs), "runs": runs,
              "orbax_install_mib": _site_mib(args.orbax_site)}
    report["load_after"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        writer, directory, mib = sys.argv[2:5]
        print(json.dumps(_worker(writer, directory, int(mib))), flush=True)
    else:
        sys.exit(main())
