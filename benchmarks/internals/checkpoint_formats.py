"""Sharded checkpoint formats: per-shard ``.npy`` files + a manifest against tensorstore's zarr.

The state of a table trained with Adam (value, ``m``, ``v``: ``--rows`` x ``--dim`` float32
each; 1 GiB per array by default) is held by ``--writers`` processes, each its contiguous rows,
as parameter servers hold their shards. Each format is written by those processes in parallel,
then restored by ``--readers`` processes owning another partitioning (a restore into another
number of parameter servers), each reading only its rows:

- ``npy`` (what ``strategy.save_checkpoint(directory)`` writes, with its own functions from
  ``sharded_checkpoint``): each writer writes its arrays as ``.npy`` files and fsyncs them; a
  reader reads the rows it owns from the files that cover them straight into its own arrays;
- ``zarr3`` (tensorstore, the storage layer under Orbax's multi-process checkpoints): one zarr
  v3 array per state, chunked by ``--chunk-rows`` rows, uncompressed, on the local file system;
  each writer writes its row range (chunks aligned to it), each reader reads its row range.

Caches are dropped between the write and the restore where this process may
(``/proc/sys/vm/drop_caches``; root), so a restore reads from the disk. Reported per format:
write and restore MB/s (all processes together, wall time from a common start) and the peak
RSS of each process above the arrays it owns (``ru_maxrss`` minus its own shards' bytes).

Run: ``python -m benchmarks.internals.checkpoint_formats [--rows 4194304 --dim 64 --writers 2
--readers 3 --reps 3]``; needs ``tensorstore`` (``pip install tensorstore``) for the zarr rows;
writes ``benchmarks/results/checkpoint_formats.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import RESULTS_DIR
from benchmarks.cluster.launch import drop_page_cache
from stratax._src.checkpoint import sharded_variables as sharded_checkpoint

STATES = ("value", "m", "v")


def _ranges(rows: int, parts: int) -> list[tuple[int, int]]:
    base, extra = divmod(rows, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (i < extra)
        out.append((start, size))
        start += size
    return out


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _zarr(path: Path, rows: int, dim: int, chunk: int, create: bool) -> Any:
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
    if create:
        return ts.open(spec, create=True, delete_existing=True, dtype=ts.float32,
                       shape=[rows, dim], chunk_layout=ts.ChunkLayout(
                           write_chunk_shape=[chunk, dim])).result()
    return ts.open(spec, open=True).result()


def _writer(fmt: str, root: str, index: int, start: int, rows: int, total: int, dim: int,
            chunk: int, go: Any, out: Any) -> None:
    rng = np.random.default_rng(index)
    arrays = {s: rng.standard_normal((rows, dim), dtype=np.float32) for s in STATES}
    own = sum(a.nbytes for a in arrays.values()) / 2**20
    go.wait()
    begin = time.perf_counter()
    if fmt == "npy":
        directory = Path(root) / f"ps{index}"
        directory.mkdir(parents=True, exist_ok=True)
        for state, value in arrays.items():
            sharded_checkpoint.write_part(directory / f"0.{state}.npy", value)
    else:
        for state, value in arrays.items():
            _zarr(Path(root) / state, total, dim, chunk, False)[start:start + rows].write(
                value).result()
    out.put((index, time.perf_counter() - begin, _rss_mib() - own))


def _reader(fmt: str, root: str, index: int, start: int, rows: int, writers: list, dim: int,
            chunk: int, go: Any, out: Any) -> None:
    arrays = {s: np.empty((rows, dim), np.float32) for s in STATES}
    for a in arrays.values():
        a.fill(0)  # own the pages before measuring
    own = sum(a.nbytes for a in arrays.values()) / 2**20
    go.wait()
    begin = time.perf_counter()
    for state, target in arrays.items():
        if fmt == "npy":
            sources = [[f"ps{w}/0", max(start, w_start) - w_start,
                        min(start + rows, w_start + w_rows) - max(start, w_start),
                        max(start, w_start) - start]
                       for w, (w_start, w_rows) in enumerate(writers)
                       if max(start, w_start) < min(start + rows, w_start + w_rows)]
            sharded_checkpoint.read_rows_into(target, Path(root), sources, f".{state}")
        else:
            total = writers[-1][0] + writers[-1][1]
            target[...] = _zarr(Path(root) / state, total, dim, chunk, False)[
                start:start + rows].read().result()
    out.put((index, time.perf_counter() - begin, _rss_mib() - own))


def _phase(target: Any, fmt: str, root: Path, parts: list[tuple[int, int]], extra: Any,
           dim: int, chunk: int) -> tuple[float, list[float]]:
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(fmt, str(root), i, start, rows, extra, dim,
                                              chunk, go, out))
             for i, (start, rows) in enumerate(parts)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # every process has built its arrays (they wait on `go`)
    go.set()
    results = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return max(r[1] for r in results), [round(r[2], 1) for r in sorted(results)]


def measure(fmt: str, args: argparse.Namespace) -> dict[str, Any]:
    total_mb = 3 * args.rows * args.dim * 4 / 1e6
    writers, readers = _ranges(args.rows, args.writers), _ranges(args.rows, args.readers)
    runs = []
    for _ in range(args.reps):
        root = Path(tempfile.mkdtemp(prefix=f"ckpt_{fmt}_", dir=args.dir))
        try:
            if fmt == "zarr3":
                for state in STATES:
                    _zarr(root / state, args.rows, args.dim, args.chunk_rows, True)
            write_s, write_extra = _phase(_writer, fmt, root, writers, args.rows, args.dim,
                                          args.chunk_rows)
            dropped = drop_page_cache()
            read_s, read_extra = _phase(_reader, fmt, root, readers, writers, args.dim,
                                        args.chunk_rows)
            disk = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
            runs.append({"write_mb_s": total_mb / write_s, "restore_mb_s": total_mb / read_s,
                         "writer_rss_above_own_mib": write_extra,
                         "reader_rss_above_own_mib": read_extra, "disk_mb": disk / 1e6,
                         "caches_dropped": dropped})
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return {"runs": runs,
            "write_mb_s": statistics.median(r["write_mb_s"] for r in runs),
            "restore_mb_s": statistics.median(r["restore_mb_s"] for r in runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.internals.checkpoint_formats",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4 * 2**20)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--readers", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=65536)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (default: /tmp)")
    parser.add_argument("--out", default=str(RESULTS_DIR / "checkpoint_formats.json"))
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"rows": args.rows, "dim": args.dim, "writers": args.writers,
                              "readers": args.readers, "state_mb": 3 * args.rows * args.dim * 4
                              / 1e6, "load_average_before": os.getloadavg()}
    for fmt in ("npy", "zarr3"):
        try:
            result[fmt] = measure(fmt, args)
        except ImportError as err:
            result[fmt] = f"not installed ({err}); pip install tensorstore"
        print(fmt, json.dumps(result[fmt], indent=1), flush=True)
    result["load_average_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
