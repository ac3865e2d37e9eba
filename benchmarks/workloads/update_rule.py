"""Keras' Adam (dense, the default) against the lazy opt-in under ParameterServerStrategy, and
one device, on the parameter-server guide's model: held-out accuracy against steps.

    python -m benchmarks.workloads.update_rule --runs 5      # ~1 min per run on 2 cores
    python -m benchmarks.workloads.update_rule --dry-run

Each run is ``update_rule_program.py`` with its own seed: ``one-device`` in one plain Keras
process; ``dense`` and ``lazy`` under ``stratax launch --workers 2 --ps 2`` (asynchronous).
Writes ``benchmarks/results/update_rule.{json,md,png}``: the median accuracy at every 10 steps
with its min-max over the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import CLUSTER_DIR, RESULTS_DIR
from benchmarks.harness.report import run_meta, write_table

RESULTS = RESULTS_DIR
PROGRAM = CLUSTER_DIR / "update_rule_program.py"
RULES = ("one-device", "dense", "lazy")
RUN_LIMIT_S = 600


def command(rule: str, out: Path, seed: int) -> list[str]:
    run = [str(PROGRAM), rule, str(out), str(seed)]
    if rule == "one-device":
        return [sys.executable, *run]
    return [sys.executable, "-m", "stratax", "launch", "--workers", "2", "--ps", "2",
            "--timeout", str(RUN_LIMIT_S - 30), *run]


def run(rule: str, seed: int, work: Path) -> dict[str, Any]:
    out = work / f"{rule}-{seed}.json"
    proc = subprocess.run(command(rule, out, seed), capture_output=True, text=True,
                          timeout=RUN_LIMIT_S)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{rule} seed {seed} failed ({proc.returncode}):\n"
                           + "\n".join((proc.stdout + proc.stderr).splitlines()[-20:]))
    return json.loads(out.read_text())


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rule: the steps, and the median, min and max accuracy at each."""
    table = {}
    for rule in RULES:
        mine = [r for r in runs if r["rule"] == rule]
        if not mine:
            continue
        columns = list(zip(*(r["accuracy"] for r in mine), strict=True))
        table[rule] = {"steps": mine[0]["steps"], "runs": len(mine),
                       "median": [statistics.median(c) for c in columns],
                       "min": [min(c) for c in columns], "max": [max(c) for c in columns],
                       "median_seconds": statistics.median(r["seconds"] for r in mine)}
    return table


def markdown(table: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = ["# Adam's update rule under ParameterServerStrategy: held-out accuracy", "",
             f"{meta['date']}, {meta['machine']}, load {meta['load']}; `{meta['command']}`.",
             "The guide's model (Embedding 1000x64, LSTM 64, Dense 10, Adam 1e-3, batch 64), "
             "chief + 2 workers + 2 ps, asynchronous; one device: plain Keras.", "",
             "| rule | runs | accuracy at step 40 | at step 80 | at step 160 (median [min-max]) |",
             "|---|---|---|---|---|"]
    for rule, row in table.items():
        cells = []
        for step in (40, 80, 160):
            i = row["steps"].index(step)
            cells.append(f"{row['median'][i]:.3f} [{row['min'][i]:.3f}-{row['max'][i]:.3f}]")
        lines.append(f"| {rule} | {row['runs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(table: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for rule, row in table.items():
        ax.plot(row["steps"], row["median"], label=f"{rule} (median of {row['runs']})")
        ax.fill_between(row["steps"], row["min"], row["max"], alpha=0.2)
    ax.set_xlabel("steps (batches of 64)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("Adam on the PS guide's model: one device, dense (default), lazy")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="seeds per rule")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    plan = [(rule, seed) for seed in range(args.runs) for rule in RULES]   # rules interleaved
    if args.dry_run:
        for rule, seed in plan:
            print(" ".join(command(rule, Path("OUT.json"), seed)))
        return 0
    runs = []
    with tempfile.TemporaryDirectory(prefix="stratax-update-rule-") as work:
        for rule, seed in plan:
            runs.append(run(rule, seed, Path(work)))
            print(f"{rule} seed {seed}: final accuracy {runs[-1]['accuracy'][-1]:.3f}",
                  flush=True)
    meta = run_meta("workloads.update_rule", argv)
    table = summarize(runs)
    write_table(args.results, "update_rule", markdown(table, meta).splitlines(),
                {"meta": meta, "summary": table, "runs": runs})
    plot(table, args.results / "update_rule.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
