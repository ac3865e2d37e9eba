"""Checkpoints of a ~100 MB training state: stratax's writer against Orbax, seen by ``fit``.

The model is an MLP 2048→2048→2048→10 trained with Adam (8.4 M parameters: 34 MB of weights,
101 MB with Adam's two slots), ``sx.OneDeviceStrategy('cpu:0')``, batch 32. Each writer runs
``fit`` for ``--steps`` steps with a checkpoint every ``--every`` steps, in its own fresh process,
``--reps`` times (median reported):

- ``none``: no checkpoint (the baseline of the stall);
- ``stratax``: ``sx.BackupAndRestore`` (atomic; keeps the newest version; writes in a
  background thread once the state is copied to host memory);
- ``stratax-sync``: the same with ``save_in_background=False`` (the writer before that option);
- ``orbax-async``: ``keras.callbacks.OrbaxCheckpoint(save_on_background=True, max_to_keep=1)``;
- ``orbax-sync``: the same with ``save_on_background=False``.

Reported per writer: the stall per checkpoint as the training loop sees it (median duration
of a step that saved minus the median step that did not: the time ``fit`` stood still), the
extra wall time of the whole ``fit`` per checkpoint (``fit`` with checkpoints minus ``none``,
divided by their count: a background writer shares the CPU with training), the resume time
(a fresh process builds the model, then reads the latest checkpoint into it:
``BackupAndRestore``'s restore, ``model.load_weights`` of the Orbax directory), the bytes one
checkpoint leaves on disk, and the time to ``import`` the writer's library.

Run: ``python -m benchmarks.checkpoint [--steps 60 --every 10 --reps 3]``; needs
``orbax-checkpoint`` importable (its rows say ``not installed`` otherwise); writes
``benchmarks/results/checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
WRITERS = ("none", "stratax", "stratax-sync", "orbax-async", "orbax-sync")
WIDTH, BATCH = 2048, 32


def _build_model() -> Any:
    import keras

    import stratax as sx

    strategy = sx.OneDeviceStrategy("cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((WIDTH,)),
                                  keras.layers.Dense(WIDTH, activation="relu"),
                                  keras.layers.Dense(WIDTH, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=keras.optimizers.Adam(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _data(steps: int) -> Any:
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.standard_normal((steps * BATCH, WIDTH), dtype=np.float32),
            rng.integers(0, 10, steps * BATCH))


def _callback(writer: str, directory: str, every: int) -> Any:
    import keras

    import stratax as sx

    if writer.startswith("stratax"):
        return sx.BackupAndRestore(directory, save_freq=every, delete_checkpoint=False,
                                   save_in_background=writer == "stratax")
    return keras.callbacks.OrbaxCheckpoint(directory, save_freq=every, max_to_keep=1,
                                           save_on_background=writer == "orbax-async")


def _train(writer: str, directory: str, steps: int, every: int) -> dict:
    """One ``fit`` in this process: per-step durations, the whole wall, bytes left on disk."""
    import_start = time.perf_counter()
    if writer.startswith("orbax"):
        import orbax.checkpoint  # noqa: F401 - timed
    import_s = time.perf_counter() - import_start
    import jax
    import keras

    model = _build_model()
    x, y = _data(steps)
    model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)  # compile the step
    ends: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            jax.block_until_ready(jax.live_arrays())
            ends.append(time.perf_counter())

    callbacks = [] if writer == "none" else [_callback(writer, directory, every)]
    start = time.perf_counter()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[*callbacks, Clock()])
    wall = time.perf_counter() - start
    steps_s = [b - a for a, b in zip([start, *ends], ends, strict=False)]
    saved = [i for i in range(steps) if (i + 1) % every == 0]
    return {"wall_s": wall, "step_s": steps_s, "saved_steps": saved if callbacks else [],
            "bytes": sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file()),
            "files": sum(1 for p in Path(directory).rglob("*") if p.is_file()),
            "import_s": import_s,
            "params_mb": sum(v.numpy().nbytes for v in model.variables) / 1e6,
            "state_mb": sum(v.numpy().nbytes for v in [*model.variables,
                                                       *model.optimizer.variables]) / 1e6}


def _resume(writer: str, directory: str) -> dict:
    """A fresh process reads the latest checkpoint into a new model; seconds for the read."""
    import numpy as np

    if writer.startswith("orbax"):
        import orbax.checkpoint  # noqa: F401 - not timed: the train row times it
    model = _build_model()
    x, y = _data(1)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # builds the optimizer's slots
    before = model.layers[0].kernel.numpy().copy()
    start = time.perf_counter()
    if writer.startswith("stratax"):
        from stratax._src.checkpoint import versions as checkpoint_io
        from stratax._src.keras import binding

        backup = _callback(writer, directory, 1)
        backup.set_model(model)
        backup._strategy = binding.model_strategy(model)
        backup._restore(*checkpoint_io.load(directory))
    else:
        model.load_weights(directory)
    seconds = time.perf_counter() - start
    return {"resume_s": seconds,
            "restored": bool(not np.allclose(before, model.layers[0].kernel.numpy()))}


def _child(argv: list[str]) -> None:
    mode, writer, directory, steps, every = argv
    import stratax  # noqa: F401 - before Keras: it picks the JAX backend
    out = (_train(writer, directory, int(steps), int(every)) if mode == "train"
           else _resume(writer, directory))
    print("RESULT " + json.dumps(out), flush=True)


def _run(*argv: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.checkpoint", "--child", *argv],
                          capture_output=True, text=True, timeout=900, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stderr or proc.stdout)[-2000:]
    return {"error": "not installed" if "No module named 'orbax'" in tail else tail}


def _summary(writer: str, trains: list[dict], resumes: list[dict], baseline: float | None
             ) -> dict:
    if any("error" in r for r in [*trains, *resumes]):
        return {"writer": writer, "error": next(r["error"] for r in [*trains, *resumes]
                                                if "error" in r)}
    stalls, extras = [], []
    for run in trains:
        saved = set(run["saved_steps"])
        plain = statistics.median(s for i, s in enumerate(run["step_s"]) if i not in saved)
        if saved:
            stalls.append(statistics.median(run["step_s"][i] for i in saved) - plain)
            if baseline is not None:
                extras.append((run["wall_s"] - baseline) / len(saved))
    row = {"writer": writer, "wall_s": statistics.median(r["wall_s"] for r in trains),
           "median_step_s": statistics.median(
               statistics.median(r["step_s"]) for r in trains),
           "checkpoints": len(trains[0]["saved_steps"]),
           "bytes_on_disk": trains[-1]["bytes"], "files": trains[-1]["files"],
           "import_s": statistics.median(r["import_s"] for r in trains),
           "state_mb": trains[0]["state_mb"]}
    if stalls:
        row.update(stall_per_checkpoint_s=statistics.median(stalls),
                   extra_wall_per_checkpoint_s=statistics.median(extras) if extras else None,
                   resume_s=statistics.median(r["resume_s"] for r in resumes),
                   resume_restored=all(r["restored"] for r in resumes))
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--writers", default=",".join(WRITERS))
    parser.add_argument("--out", default=str(RESULTS / "checkpoint.json"))
    args = parser.parse_args(argv)
    rows, baseline = [], None
    for writer in args.writers.split(","):
        trains, resumes = [], []
        for _ in range(args.reps):
            with tempfile.TemporaryDirectory(prefix="sx-ckpt-bench-") as root:
                directory = os.path.join(root, "ckpt")
                trains.append(_run("train", writer, directory, str(args.steps), str(args.every)))
                if writer != "none" and "error" not in trains[-1]:
                    resumes.append(_run("resume", writer, directory, "0", "0"))
        row = _summary(writer, trains, resumes, baseline)
        if writer == "none" and "error" not in row:
            baseline = row["wall_s"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {"benchmark": "checkpoint", "steps": args.steps, "every": args.every,
              "reps": args.reps, "model": f"MLP {WIDTH}-{WIDTH}-{WIDTH}-10, Adam, batch {BATCH}",
              "python": sys.version.split()[0], "cores": os.cpu_count(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
    else:
        main()
