"""Write one benchmark's results: raw JSON, a markdown table, and a PNG bar chart."""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.configs import SYSTEMS, WORKLOADS, Benchmark
from benchmarks.harness.stats import SPREAD_FLAG, ConfigOutcome, Summary, ratio

_DASH = "-"


def write_table(results: Path, stem: str, lines: list[str], raw: Any) -> None:
    """Writes ``<stem>.md`` (the markdown ``lines``) and ``<stem>.json`` (``raw``) under
    ``results``, and prints the table: the result files of the stand-alone benchmarks."""
    results.mkdir(exist_ok=True)
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (results / f"{stem}.json").write_text(json.dumps(raw, indent=1) + "\n")
    print("\n".join(lines))


def round_trip_table(title: str, note: str, column: str, runs: dict[str, list[dict]],
                     label: Any = str) -> list[str]:
    """A markdown table of round-trip medians: one row per ``"<KB>:<kind>"`` key of ``runs``
    (each repetition a dict of ``wall_ms``, ``client_cpu_ms``, ``server_cpu_ms``, ``load``),
    the kind shown as ``label(kind)`` under ``column``."""
    lines = [title, "", note, "",
             f"| KB each way | {column} | wall ms/call | client CPU ms/call | server CPU ms/call "
             "| 1-min load during the reps |", "| ---: | --- | ---: | ---: | ---: | --- |"]
    for key, reps in runs.items():
        kb, kind = key.split(":")
        med = {k: statistics.median(r[k] for r in reps)
               for k in ("wall_ms", "client_cpu_ms", "server_cpu_ms")}
        loads = ", ".join(f"{r['load']:.1f}" for r in reps)
        lines.append(f"| {kb} | {label(kind)} | {med['wall_ms']:.3f} | "
                     f"{med['client_cpu_ms']:.3f} | {med['server_cpu_ms']:.3f} | {loads} |")
    return lines


def run_meta(module: str, argv: list[str] | None) -> dict[str, Any]:
    """When and where a stand-alone benchmark ran (with the load: a busy box is said so), and
    the command that reproduces it; ``module`` is the benchmark's module under ``benchmarks``
    (e.g. ``workloads.chaos``)."""
    args = sys.argv[1:] if argv is None else argv
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                            capture_output=True, text=True).stdout.strip()
    return {"date": dt.date.today().isoformat(), "machine": f"{os.cpu_count()} CPUs",
            "commit": commit or None,
            "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "command": " ".join(["python -m benchmarks." + module, *args])}


def _num(value: float, digits: int = 0) -> str:
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _cell(summary: Summary | None, digits: int = 0) -> str:
    return _DASH if summary is None else _num(summary.median, digits)


def _throughput(o: ConfigOutcome) -> str:
    if o.status != "ok":
        return f"{o.status}: {o.reason}".replace("|", "/")
    s = o.metric("samples_per_s")
    if s is None:
        return "failed: no successful repetition"
    return f"{_num(s.median)} ({_num(s.min)}-{_num(s.max)})"


def _header(bench: Benchmark, meta: dict[str, Any], outcomes: list[ConfigOutcome]) -> list[str]:
    m = meta["machine"]
    loads = [r["loadavg_before"] for o in outcomes for r in o.reps if "loadavg_before" in r]
    load = (f" 1-min load average before each repetition: {min(loads):.1f}-{max(loads):.1f} "
            f"(other work on the machine)." if loads else "")
    versions = ", ".join(f"{k} {v}" for k, v in sorted(meta["versions_used"].items()))
    return [
        f"# Benchmark `{bench.name}`: {bench.title}",
        "",
        f"Mode **{meta['mode']}**, {meta['reps']} repetitions per configuration, each in a fresh "
        f"process; global batch {meta['global_batch']}; {meta['finished']}.  ",
        f"Machine: {m['cpu_model']}, {m['cpu_count']} cores, {m['mem_total_gib']} GiB, device "
        f"{meta['device']}.{load}  ",
        f"Versions: {versions}.  ",
        f"Baseline for the ratio column: **{SYSTEMS[bench.baseline].label}** "
        f"(`{bench.baseline}`), same workload and steps_per_execution.",
        "",
        "samples/s: median (min-max) over repetitions of the throughput of the timed epochs "
        "(after one warm-up epoch). Median-epoch: the same from the median timed epoch only "
        "(much higher than samples/s = one-off costs inside the timed window). "
        "First execution: from the `fit` call until the first execution (1 or "
        "steps_per_execution steps) is done: input setup, tracing, compilation, first run. "
        "RSS: peak resident memory of the process (largest process for multi-process). "
        f"Loss: mean training loss of the last epoch. `(!)` = (max-min)/median > "
        f"{SPREAD_FLAG:.0%}.",
        "",
    ]


def markdown(bench: Benchmark, outcomes: list[ConfigOutcome], meta: dict[str, Any]) -> str:
    """The results table (and ratio table) of one benchmark as GitHub markdown."""
    by_key = {(o.system, o.workload, o.spe): o for o in outcomes}
    lines = _header(bench, meta, outcomes)
    lines += ["| workload | spe | system | samples/s median (min-max) | x baseline | median-epoch "
              "samples/s | first exec s | peak RSS MiB | final loss | note |",
              "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for o in outcomes:
        base = by_key.get((bench.baseline, o.workload, o.spe))
        r = ratio(o, base)
        s = o.metric("samples_per_s")
        notes = []
        if s is not None and s.flagged:
            notes.append(f"(!) spread {s.spread:.0%}")
        if SYSTEMS[o.system].note:
            notes.append(SYSTEMS[o.system].note)
        ratio_cell = _DASH if r is None else f"{r:.2f}"
        lines.append(
            f"| {o.workload} | {o.spe} | {SYSTEMS[o.system].label} | {_throughput(o)} | "
            f"{ratio_cell} | {_cell(o.metric('median_epoch_samples_per_s'))} "
            f"| {_cell(o.metric('first_execution_s'), 1)} "
            f"| {_cell(o.metric('peak_rss_mib'))} | {_cell(o.metric('final_loss'), 4)} | "
            f"{'; '.join(notes)} |")
    present = {o.system for o in outcomes}
    pairs = [(a, b) for a, b in bench.pairs if a in present and b in present]
    if pairs:
        cols = sorted({(o.workload, o.spe) for o in outcomes},
                      key=lambda c: (list(WORKLOADS).index(c[0]), c[1]))
        lines += ["", "Ratios of median samples/s (> 1: the first system is faster):", "",
                  "| ratio | " + " | ".join(f"{w} spe {s}" for w, s in cols) + " |",
                  "| --- |" + " ---: |" * len(cols)]
        for num, den in pairs:
            cells = []
            for w, spe in cols:
                q = ratio(by_key.get((num, w, spe)), by_key.get((den, w, spe)))
                cells.append(_DASH if q is None else f"{q:.2f}")
            lines.append(f"| `{num}` / `{den}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(bench: Benchmark, outcomes: list[ConfigOutcome], path: Path) -> None:
    """Bar chart: one panel per workload, bars = systems, whiskers = min..max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(o.workload for o in outcomes))
    spes = list(dict.fromkeys(o.spe for o in outcomes))
    systems = list(dict.fromkeys(o.system for o in outcomes))
    by_key = {(o.system, o.workload, o.spe): o for o in outcomes}
    fig, axes = plt.subplots(1, len(workloads), figsize=(max(9.0, 5.5 * len(workloads)), 4.5),
                             squeeze=False)
    width = 0.8 / max(len(systems), 1)
    colors = plt.get_cmap("tab10")
    for ax, w in zip(axes[0], workloads, strict=False):
        for j, sys_name in enumerate(systems):
            for i, spe in enumerate(spes):
                o = by_key.get((sys_name, w, spe))
                x = i + (j - (len(systems) - 1) / 2) * width
                s = o.metric("samples_per_s") if o else None
                if s is None:
                    ax.text(x, 0, "x", ha="center", va="bottom", color=colors(j % 10))
                    continue
                ax.bar(x, s.median, width, color=colors(j % 10),
                       yerr=[[s.median - s.min], [s.max - s.median]], capsize=2,
                       label=SYSTEMS[sys_name].label if i == 0 else None)
        ax.set_xticks(range(len(spes)), [f"steps_per_execution={s}" for s in spes])
        ax.set_title(WORKLOADS[w].title, fontsize=10)
        ax.set_ylabel("samples/s (median, min-max)")
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8)
    fig.suptitle(f"{bench.name}: {bench.title}\n(x = failed or not installed)", fontsize=11)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * ((len(labels) + 1) // 2), 1, 1))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write(bench: Benchmark, outcomes: list[ConfigOutcome], meta: dict[str, Any],
          results_dir: Path) -> dict[str, Path]:
    """Write ``<name>.json``, ``<name>.md`` and ``<name>.png``; return their paths."""
    results_dir.mkdir(parents=True, exist_ok=True)
    meta = dict(meta, finished=dt.datetime.now().strftime("%Y-%m-%d %H:%M"))
    paths = {ext: results_dir / f"{bench.name}.{ext}" for ext in ("json", "md", "png")}
    payload = {"benchmark": bench.name, "title": bench.title, "baseline": bench.baseline,
               "pairs": bench.pairs, **meta, "configs": [o.to_json() for o in outcomes]}
    paths["json"].write_text(json.dumps(payload, indent=1, default=str))
    paths["md"].write_text(markdown(bench, outcomes, meta))
    plot(bench, outcomes, paths["png"])
    return paths


def write_summary(results_dir: Path, names: list[str]) -> Path:
    """Concatenate the existing ``<name>.md`` tables (in ``names`` order) into ``summary.md``."""
    parts = [(results_dir / f"{n}.md").read_text() for n in names
             if (results_dir / f"{n}.md").exists()]
    path = results_dir / "summary.md"
    path.write_text("\n".join(p.replace("\n# ", "\n## ").replace("# Benchmark", "## Benchmark", 1)
                              for p in parts))
    return path
