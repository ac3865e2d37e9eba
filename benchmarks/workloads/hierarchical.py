"""2 hosts x 2 processes: the hierarchical all-reduce against the same 4 processes on gloo alone.

The two "hosts" are network namespaces joined by a veth pair (``benchmarks/cluster/netns.py``);
workers 0, 1 run in the first, 2, 3 in the second. Each repetition runs ``fit`` of the suite's MLP
(784-128-10, global batch 256, ``steps_per_execution`` 32, one warm-up epoch, then timed epochs)
twice, back to back: with ``STRATAX_CPU_COLLECTIVES`` unset (``auto``: shared memory inside
each namespace, gloo between them) and with ``gloo`` (every collective over TCP). Both put 4
processes on this box's cores, so the ratio is what counts. Per run: samples/s (worker 0's
timed epochs), the MLP's gradients (one buffer) all-reduced 200 times in one compiled loop
(``benchmarks.workloads.allreduce``'s method: the transport without the step's compute), and the
bytes that crossed the veth pair per step in both directions (the namespaces'
``/sys/class/net/*/statistics`` counters over the same epochs, read by the first process of
each namespace).

Run (as root)::

    python -m benchmarks.workloads.hierarchical --reps 5

writes ``benchmarks/results/hierarchical[_TAG].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from benchmarks import RESULTS_DIR
from benchmarks.cluster import netns, workers
from benchmarks.workloads.allreduce import MLP_GRADS, _in_loop

RESULTS = RESULTS_DIR
STEPS_PER_EPOCH = 32
BATCH = 256
MODES = {"hierarchical": "auto", "gloo": "gloo"}


def _counters(device: str) -> int:
    total = 0
    for name in ("tx_bytes", "rx_bytes"):
        total += int(Path(f"/sys/class/net/{device}/statistics/{name}").read_text())
    return total


class _ChosenCollectives(logging.Handler):
    """Keeps stratax's INFO line that names the CPU collectives it chose ("CPU collectives:
    hierarchical all-reduce ..." when it chose the hierarchical one)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("CPU collectives:"):
            self.lines.append(record.getMessage())


def _worker(epochs: int, device: str) -> None:
    import numpy as np

    import stratax as sx

    chosen = _ChosenCollectives()
    stratax_log = logging.getLogger("stratax")
    stratax_log.addHandler(chosen)
    stratax_log.setLevel(logging.INFO)
    strategy = sx.MultiWorkerMirroredStrategy(
        communication_options=sx.CommunicationOptions(timeout_seconds=120))
    import keras

    from benchmarks.harness.configs import WORKLOADS
    from benchmarks.workloads.models import build_model

    n = STEPS_PER_EPOCH * BATCH
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((n, 784), dtype=np.float32)
    y = np.argmax(x @ rng.standard_normal((784, 10), dtype=np.float32), axis=1).astype(np.int32)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_model(keras, WORKLOADS["mlp"])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), steps_per_execution=32,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)  # compile, warm up
    before = _counters(device)
    start = time.perf_counter()
    history = model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0)
    seconds = time.perf_counter() - start
    crossed = _counters(device) - before
    # The collective alone: the MLP's gradients (one buffer) all-reduced in a compiled loop.
    size = sum(int(np.prod(shape)) for shape in MLP_GRADS)
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: np.full((size,), ctx.replica_id_in_sync_group + 1, np.float32))

    def step(x):
        return sx.get_replica_context().all_reduce(sx.ReduceOp.SUM, x)

    print("RESULT " + json.dumps({
        "allreduce_us": _in_loop(strategy, step, value, 200) * 1e6,
        "samples_per_s": epochs * n / seconds, "veth_bytes": crossed,
        "steps": epochs * STEPS_PER_EPOCH, "loss": history.history["loss"][-1],
        "hierarchical": any("hierarchical all-reduce" in line for line in chosen.lines)}),
        flush=True)
    sys.stdout.flush()
    os._exit(0)


def _one_run(bed: netns.TestBed, transport: str, epochs: int) -> dict:
    commands, spaces, addresses = [], [], []
    for index in range(4):
        host = index // 2
        commands.append([sys.executable, "-m", "benchmarks.workloads.hierarchical",
                         "--epochs", str(epochs),
                         "--worker", f"{bed.names[host]}-v"])
        spaces.append(bed.names[host])
        addresses.append(bed.addresses[host])
    procs = workers.start(commands, transport=transport, addresses=tuple(addresses),
                          namespaces=tuple(spaces))
    outputs = workers.finish_all(procs)
    first = [workers.result(outputs[i]) for i in (0, 2)]  # the first process of each host
    # Each veth end counts what its namespace sent and received: both ends see the same bytes.
    per_step = first[0]["veth_bytes"] / first[0]["steps"]
    return {"samples_per_s": first[0]["samples_per_s"], "veth_bytes_per_step": per_step,
            "mlp_grads_allreduce_us": first[0]["allreduce_us"],
            "loss": first[0]["loss"], "hierarchical": first[0]["hierarchical"],
            "other_host_veth_bytes_per_step": first[1]["veth_bytes"] / first[1]["steps"]}


def table(runs: dict[str, list[dict]]) -> str:
    """The markdown table of ``runs`` (as stored in the JSON)."""
    lines = ["| transport | samples/s, median [min-max] | vs gloo | bytes across hosts per step "
             "(both directions), median | MLP gradients' all-reduce in a loop (us), median "
             "[min-max] |", "| --- | --- | ---: | ---: | --- |"]
    gloo = statistics.median(r["samples_per_s"] for r in runs["gloo"])
    def spread(rows: list[dict], key: str) -> str:
        values = [r[key] for r in rows]
        return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"

    for mode, rows in runs.items():
        ratio = statistics.median(r["samples_per_s"] for r in rows) / gloo
        crossed = statistics.median(r["veth_bytes_per_step"] for r in rows)
        lines.append(f"| {mode} | {spread(rows, 'samples_per_s')} | {ratio:.2f}x | "
                     f"{crossed:,.0f} | {spread(rows, 'mlp_grads_allreduce_us')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="timed epochs of 32 steps")
    parser.add_argument("--tag", default="", help="result file suffix")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        _worker(args.epochs, args.worker)
        return
    tag = os.getpid() % 200 + 20
    bed = netns.TestBed((f"sxh{os.getpid()}a", f"sxh{os.getpid()}b"),
                        (f"10.214.{tag}.1", f"10.214.{tag}.2"))
    bed.up()
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    loads = [os.getloadavg()[0]]
    try:
        for _ in range(max(args.reps, 1)):  # interleaved: both see the same stretch of load
            for mode, transport in MODES.items():
                runs[mode].append(_one_run(bed, transport, args.epochs))
            loads.append(os.getloadavg()[0])
    finally:
        bed.down()
    meta = {"cpu_count": os.cpu_count(), "python": platform.python_version(),
            "machine": platform.machine(), "reps": args.reps, "epochs": args.epochs,
            "steps_per_epoch": STEPS_PER_EPOCH, "global_batch": BATCH, "processes": "2 x 2",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg": loads}
    RESULTS.mkdir(exist_ok=True)
    stem = "hierarchical" + (f"_{args.tag}" if args.tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
    text = (f"`fit` of the MLP, 2 network namespaces x 2 processes (not pinned, "
            f"{os.cpu_count()} cores), spe 32, {args.epochs} timed epochs of "
            f"{STEPS_PER_EPOCH} steps; {args.reps} interleaved reps, load "
            f"{min(loads):.1f}-{max(loads):.1f}.\n\n" + table(runs))
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
