"""Checkpoints of state sharded over 2 processes: stratax's per-process writer against Orbax.

Two processes (``jax.distributed`` on 127.0.0.1, 2 forced CPU devices each) hold ``--mib`` MiB
of float32 state as 4 global ``jax.Array``s whose rows are split over all 4 devices, so each
process holds half and no process can read any array whole. Each writer saves it (every
process its own shards; timed from a barrier until the save returns in every process, so a
commit by the slowest one included), the page cache is dropped where this process may (root),
then both processes restore it into another layout (columns split over the 4 devices: every
process reads parts of every other's shards), and check every value:

- ``stratax``: ``checkpoint_io.save_sharded`` / ``load`` + ``Entry.place`` (the writer of
  ``sx.BackupAndRestore`` for state held in parts: ``.npy`` per shard, committed by process 0
  once every process's files are durable);
- ``orbax``: ``orbax.checkpoint.StandardCheckpointer`` ``save`` + ``wait_until_finished``, and
  ``restore`` with the target shardings (tensorstore zarr/OCDBT underneath).

Reported per writer, median of ``--reps`` fresh process pairs run alternately: save and
restore wall seconds (the slower process), the peak RSS an operation adds in a process
(``VmHWM`` reset to ``VmRSS`` before it; for a restore, above the restored arrays), files and
bytes on disk; plus Orbax's
import time in a process that already imported JAX and its install size (the packages it adds
to an environment that has JAX, NumPy and tensorstore: ``--orbax-site`` names that directory).

Run: ``python -m benchmarks.internals.sharded_checkpoint [--mib 200 --reps 3 --python PY]`` with
``PY`` an interpreter that can import ``orbax.checkpoint`` (its rows say ``not installed``
otherwise); writes ``benchmarks/results/sharded_checkpoint.json``.
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
ROWS = 4096


def _arrays(mib: int) -> dict[str, tuple[int, int]]:
    """4 arrays of ``mib / 4`` MiB each: name -> shape (rows, columns)."""
    columns = mib * 2**20 // 4 // 4 // ROWS
    return {f"layer{i}/kernel": (ROWS, columns) for i in range(4)}


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


def _worker(writer: str, directory: str, mib: int, process: int, port: int) -> dict[str, Any]:
    """One process of a pair: builds its half of the state, saves, restores, checks."""
    import jax
    import numpy as np

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from benchmarks.cluster.launch import drop_page_cache
    from stratax._src import seam

    client = seam.distributed_client()
    barriers = iter(range(100))

    def barrier() -> None:
        client.wait_at_barrier(f"bench-{next(barriers)}", 600_000)

    mesh = Mesh(np.array(jax.devices()), ("x",))
    rows, columns = NamedSharding(mesh, P("x", None)), NamedSharding(mesh, P(None, "x"))

    def whole(name: str, shape: tuple[int, int], index: Any = ()) -> np.ndarray:
        """Noise as trained weights are (no compression wins), a function of the position."""
        seed = int(name[5])
        r = np.arange(shape[0], dtype=np.float64)[index[0] if index else slice(None), None]
        c = np.arange(shape[1], dtype=np.float64)[index[1] if index else slice(None)][None]
        return (np.sin(r * 12.9898 + c * 78.233 + seed) * 43758.5453 % 1).astype(np.float32)

    shapes = _arrays(mib)
    state = {name: jax.make_array_from_callback(shape, rows, lambda i, n=name, s=shape:
                                                whole(n, s, i))
             for name, shape in shapes.items()}
    held = sum(s.data.nbytes for a in state.values() for s in a.addressable_shards)
    result: dict[str, Any] = {"held_mib": held / 2**20}
    if writer == "orbax":
        start = time.perf_counter()
        import orbax.checkpoint as ocp
        result["import_s"] = time.perf_counter() - start
        checkpointer = ocp.StandardCheckpointer()
    else:
        from stratax._src.checkpoint import sharded_state
        from stratax._src.checkpoint import versions as checkpoint_io
    target = os.path.join(directory, "ckpt")
    barrier()
    before = _peak_from_here()
    start = time.perf_counter()
    if writer == "orbax":
        checkpointer.save(target, state)
        checkpointer.wait_until_finished()
    else:
        parts = {name: sharded_state.local_parts(value) for name, value in state.items()}
        checkpoint_io.save_sharded(target, {}, parts, {}, list(state))
        del parts
    barrier()
    result["save_s"] = time.perf_counter() - start
    result["save_rss_mib"] = _status_mib("VmHWM") - before
    if process == 0:
        result["dropped_cache"] = drop_page_cache()
        files = [p for p in Path(target).rglob("*") if p.is_file()]
        result["files"], result["disk_mib"] = len(files), sum(
            p.stat().st_size for p in files) / 2**20
    barrier()
    before = _peak_from_here()
    start = time.perf_counter()
    if writer == "orbax":
        abstract = {name: jax.ShapeDtypeStruct(shape, np.float32, sharding=columns)
                    for name, shape in shapes.items()}
        restored = checkpointer.restore(target, abstract)
    else:
        arrays, _ = checkpoint_io.load(target)
        restored = {name: arrays[name].place(columns) for name in shapes}
    jax.block_until_ready(restored)
    barrier()
    result["restore_s"] = time.perf_counter() - start
    # above the restored arrays themselves (the state this process holds again)
    result["restore_rss_mib"] = _status_mib("VmHWM") - before - held / 2**20
    for name, value in restored.items():
        if value.sharding != columns:
            raise RuntimeError(f"{writer} restored {name} on {value.sharding}, not {columns}")
        for shard in value.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data),
                                          whole(name, shapes[name], shard.index))
    barrier()
    return result


def _pair(python: str, writer: str, mib: int) -> dict[str, Any]:
    """Runs one fresh pair of processes for ``writer``; returns the slower process's times
    and the larger peak memory."""
    from benchmarks.cluster.launch import free_ports

    (port,) = free_ports(1)
    directory = tempfile.mkdtemp(prefix=f"sharded-ckpt-{writer}-")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([python, "-m", "benchmarks.internals.sharded_checkpoint", "--worker",
                               writer, directory, str(mib), str(i), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=REPO_ROOT, start_new_session=True)
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
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    merged = {k: max(r[k] for r in results) for k in ("save_s", "restore_s", "save_rss_mib",
                                                        "restore_rss_mib", "held_mib")}
    merged.update({k: results[0][k] for k in ("files", "disk_mib", "dropped_cache")})
    if "import_s" in results[0]:
        merged["import_s"] = max(r["import_s"] for r in results)
    return merged


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--python", default=sys.executable,
                        help="an interpreter that imports orbax.checkpoint and stratax")
    parser.add_argument("--orbax-site", default=None,
                        help="site-packages of a venv holding only Orbax and its additions")
    parser.add_argument("--out", default=str(RESULTS_DIR / "sharded_checkpoint.json"))
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {w: [] for w in WRITERS}
    for _ in range(args.reps):
        for writer in WRITERS:
            runs[writer].append(_pair(args.python, writer, args.mib))
            print(writer, runs[writer][-1], flush=True)
    rows = {}
    for writer, results in runs.items():
        if any("error" in r for r in results):
            rows[writer] = {"error": results[0].get("error")}
            continue
        rows[writer] = {k: statistics.median(r[k] for r in results) for k in results[0]
                        if k != "dropped_cache"}
        rows[writer]["dropped_cache"] = all(r["dropped_cache"] for r in results)
    report = {"command": "python -m benchmarks.internals.sharded_checkpoint " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "date": time.strftime("%Y-%m-%d"), "load_before": os.getloadavg()[0],
              "mib": args.mib, "reps": args.reps, "writers": rows, "runs": runs,
              "orbax_install_mib": _site_mib(args.orbax_site)}
    report["load_after"] = os.getloadavg()[0]
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        writer, directory, mib, process, port = sys.argv[2:7]
        print(json.dumps(_worker(writer, directory, int(mib), int(process), int(port))),
              flush=True)
    else:
        main()
