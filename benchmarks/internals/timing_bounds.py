"""Timing bounds the unit tests check only by order of events, measured here:

    python -m benchmarks.internals.timing_bounds --reps 5

* ``rpc_give_up_s``: a call with ``timeout=0.3`` to a server that holds its reply; the seconds
  until the call raises (``tests/parameter_server/transport/test_local_socket.py`` checks that
  it gives up before the reply, not how fast).
* ``backup_step_s``: the step that starts a 0.5 s backup write, in the background and with
  ``save_in_background=False``, beside the median step without a save
  (``tests/keras/callbacks/test_backup.py`` checks the order of steps and the write).

Writes ``benchmarks/results/timing_bounds.{json,md}`` with the load of the box.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import RESULTS_DIR
from benchmarks.harness.report import run_meta, write_table

RESULTS = RESULTS_DIR
RPC_TIMEOUT_S = 0.3
WRITE_S = 0.5


def rpc_give_up_seconds() -> float:
    """Seconds from a call with a 0.3 s timeout to its ``WorkerUnavailableError``."""
    from stratax._src.core.errors import WorkerUnavailableError
    from stratax._src.parameter_server.transport import rpc, rpc_server

    released = threading.Event()

    def handler(frame: Any) -> bytes:
        released.wait(timeout=30)
        return rpc.response({})

    server = rpc_server.RpcServer("ps 0", "127.0.0.1", 0, handler, max_workers=2)
    server.start()
    client = rpc.RpcClient("ps 0", f"127.0.0.1:{server.port}", timeout=10)
    try:
        start = time.perf_counter()
        try:
            client.call("hold", {}, timeout=RPC_TIMEOUT_S)
        except WorkerUnavailableError:
            return time.perf_counter() - start
        raise RuntimeError("the held call returned instead of timing out")
    finally:
        released.set()
        client.close()
        server.stop(0)


def backup_step_seconds(background: bool) -> tuple[float, float]:
    """(the step that saves, the median other step) with a backup write of 0.5 s."""
    import keras

    import stratax as sx
    from stratax._src.checkpoint import versions as checkpoint_io

    real_save = checkpoint_io.save

    def slow_save(*args: Any) -> Any:
        time.sleep(WRITE_S)
        return real_save(*args)

    ends: list[float] = []
    clock = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append(time.perf_counter()))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8)).astype(np.float32)
    y = rng.normal(size=(96, 1)).astype(np.float32)
    checkpoint_io.save = slow_save
    try:
        with tempfile.TemporaryDirectory() as backup_dir:
            strategy = sx.OneDeviceStrategy("cpu:0")
            with strategy.scope():
                model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
                model.compile(optimizer="sgd", loss="mse")
            backup = sx.BackupAndRestore(backup_dir, save_freq=5, delete_checkpoint=False,
                                         save_in_background=background)
            model.fit(x, y, batch_size=16, verbose=0, callbacks=[backup, clock])
    finally:
        checkpoint_io.save = real_save
    steps = np.diff(ends)                      # steps[3]: step 5, the one that saves
    return float(steps[3]), float(np.median(np.delete(steps, 3)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    give_up = [rpc_give_up_seconds() for _ in range(args.reps)]
    background = [backup_step_seconds(True) for _ in range(args.reps)]
    foreground = [backup_step_seconds(False) for _ in range(args.reps)]
    rows = [("rpc give-up, timeout 0.3 s", give_up),
            ("backup step, 0.5 s write in the background", [b[0] for b in background]),
            ("backup step, 0.5 s write in the step", [f[0] for f in foreground]),
            ("other steps", [b[1] for b in background + foreground])]
    meta = run_meta("internals.timing_bounds", argv)
    lines = [f"# Timing bounds ({meta['date']}, {meta['machine']}, load {meta['load']})", "",
             f"`{meta['command']}`", "", "| measure | median s | min s | max s |",
             "|---|---|---|---|"]
    lines += [f"| {name} | {statistics.median(v):.3f} | {min(v):.3f} | {max(v):.3f} |"
              for name, v in rows]
    write_table(args.results, "timing_bounds", lines,
                {"meta": meta, "rows": {name: v for name, v in rows}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
