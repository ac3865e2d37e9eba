"""The benchmark harness's plumbing, in seconds: its dry run, its dependency check, and its
report step (tables, plot, summary) on fake repetition results. No benchmark runs here.

A fake ``run_rep`` stands in for the child processes; everything after it (the suite, the
statistics, the markdown, the PNG and ``summary.md``) is the real code, writing to a
temporary directory instead of ``benchmarks/results/``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import benchmarks.__main__ as bench_cli
import benchmarks.harness.envs
import benchmarks.harness.suite
from benchmarks.harness.configs import BENCHMARKS
from benchmarks.harness.runner import RepResult

REPO = Path(__file__).resolve().parents[1]
MIRRORED_KEYS = [c.key for c in BENCHMARKS["mirrored"].configs("quick")]

# Median samples/s per system at steps_per_execution=1 (doubled at 32); repetitions spread
# +-5 % around it, except kjax-dp-2dev (+-50 %, so its row carries the spread flag).
BASE = {"sx-onedevice": 1000.0, "sx-mirrored-1": 1200.0, "sx-mirrored-2dev": 800.0,
        "kjax-single": 2000.0, "kjax-dp-2dev": 600.0, "sx-onedevice-noprefetch": 900.0,
        "sx-mirrored-2dev-noprefetch": 700.0}
FAILS = "mlp.spe32.sx-mirrored-2dev"  # fails at repetition 2


def _fake_run_rep(config, rep, mode, device, python, data, work_dir) -> RepResult:
    spread = 0.5 if config.system == "kjax-dp-2dev" else 0.05
    rate = BASE[config.system] * (1 if config.spe == 1 else 2) * (1 + spread * (rep - 2))
    if config.key == FAILS and rep == 2:
        return RepResult(False, "task 0 died with exit code 1: boom", {"status": "failed"})
    return RepResult(True, "", {
        "status": "ok", "samples_per_s": rate, "median_epoch_samples_per_s": rate * 1.01,
        "first_execution_s": 0.7, "peak_rss_mib": 500.0, "final_loss": 0.0456,
        "loadavg_before": 1.5, "versions": {"jax": "0.0-fake", "keras": "0.0-fake"}})


@pytest.fixture
def fake_runs(monkeypatch, tmp_path):
    """Children replaced by ``_fake_run_rep``; results go to ``tmp_path / "results"``."""
    monkeypatch.setattr(benchmarks.harness.suite, "run_rep", _fake_run_rep)
    monkeypatch.setattr(benchmarks.harness.suite, "ensure_data",
                        lambda *args: (tmp_path / "x.npy", tmp_path / "y.npy"))
    monkeypatch.setattr(benchmarks.harness.suite, "package_versions",
                        lambda python: {"jax": "fake"})
    monkeypatch.setattr(bench_cli, "RESULTS_DIR", tmp_path / "results")
    return tmp_path / "results"


def _row(markdown: str, spe: int, label: str) -> list[str]:
    (line,) = [ln for ln in markdown.splitlines() if ln.startswith(f"| mlp | {spe} | {label} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_run_writes_tables_plot_and_summary_from_the_repetitions(fake_runs, capsys):
    assert bench_cli.main(["run", "--quick", "--only", "mirrored"]) == 0
    out = capsys.readouterr().out
    assert f"Results in {fake_runs}/" in out and "14 configurations, 1 failed" in out

    md = (fake_runs / "mirrored.md").read_text()
    # workload, spe, system, samples/s median (min-max), x baseline (kjax-single), ...
    assert _row(md, 1, "stratax OneDeviceStrategy")[3:5] == ["1,000 (950-1,050)", "0.50"]
    assert _row(md, 32, "stratax MirroredStrategy, default devices")[3:5] == [
        "2,400 (2,280-2,520)", "0.60"]
    dp = _row(md, 1, "Keras 3 JAX DataParallel, 2 forced devices (host waits each step)")
    assert dp[3] == "600 (300-900)" and dp[-1].startswith("(!) spread 100%")
    failed = _row(md, 32, "stratax MirroredStrategy, 2 forced devices")
    assert failed[3] == "failed: task 0 died with exit code 1: boom (rep 2; 1 earlier reps ok)"
    assert failed[4] == "-"
    assert "| `sx-mirrored-1` / `sx-onedevice` | 1.20 | 1.20 |" in md
    assert "| `sx-mirrored-2dev` / `sx-onedevice` | 0.80 | - |" in md
    assert "| `sx-onedevice` / `sx-onedevice-noprefetch` | 1.11 | 1.11 |" in md
    assert "Versions: jax 0.0-fake, keras 0.0-fake." in md

    raw = json.loads((fake_runs / "mirrored.json").read_text())
    assert [c["key"] for c in raw["configs"]] == MIRRORED_KEYS
    by_key = {c["key"]: c for c in raw["configs"]}
    assert by_key["mlp.spe1.kjax-single"]["samples_per_s_summary"]["median"] == 2000.0
    assert len(by_key["mlp.spe1.kjax-single"]["reps"]) == 3
    assert by_key[FAILS]["status"] == "failed"

    summary = (fake_runs / "summary.md").read_text()
    assert summary.startswith("## Benchmark `mirrored`") and md.split("\n", 1)[1] in summary

    import matplotlib.image
    import matplotlib.pyplot as plt

    png = fake_runs / "mirrored.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rgb = (matplotlib.image.imread(png)[..., :3] * 255).round().astype(int)
    assert rgb.shape[0] > 300 and rgb.shape[1] > 600

    def pixels(system_index: int) -> int:
        color = np.round(np.array(plt.get_cmap("tab10")(system_index)[:3]) * 255).astype(int)
        return int(np.all(rgb == color, axis=-1).sum())

    # Bars in the systems' colours (order of the table), heights as the medians: kjax-single's
    # bars are twice sx-onedevice's (the legend adds the same small patch to both).
    counts = [pixels(i) for i in range(len(BASE))]
    assert all(c > 0 for c in counts), counts
    assert 1.6 < counts[3] / counts[0] < 2.2, counts


def test_missing_harness_dependency_stops_run_before_any_child(monkeypatch, fake_runs, capsys):
    monkeypatch.setattr(benchmarks.harness.envs, "HARNESS_MODULES",
                        {"matplotlib": "matplotlib", "no_such_module_in_test": "no-such-dist"})

    def no_child(*args):
        pytest.fail("a child was started although a harness dependency is missing")

    monkeypatch.setattr(benchmarks.harness.suite, "run_rep", no_child)
    assert bench_cli.main(["run", "--quick", "--only", "mirrored"]) == 2
    err = capsys.readouterr().err
    assert "the harness needs no-such-dist" in err
    assert "python -m pip install -e . -e ./benchmarks" in err
    assert not fake_runs.exists()

    assert bench_cli.main(["run", "--quick", "--only", "mirrored", "--dry-run"]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM: the harness needs no-such-dist" in out
    assert out.strip().endswith("dry run: 1 problem(s)")


def test_dry_run_prints_the_plan_and_starts_nothing():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--quick", "--only", "mirrored",
         "--reps", "4", "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "STRATAX_TEST_CHILD_PLOTS": "1"})  # it checks for matplotlib
    assert done.returncode == 0, done.stderr
    listed = [ln.strip() for ln in done.stdout.splitlines() if ln.startswith("    mlp.")]
    assert listed == MIRRORED_KEYS
    assert "plan: 14 configurations, 56 child runs (4 reps, quick mode)" in done.stdout
    assert done.stdout.strip().endswith("dry run: OK")


def test_too_few_repetitions_are_refused_with_the_fix(capsys):
    with pytest.raises(SystemExit) as exited:
        bench_cli.main(["run", "--reps", "2", "--dry-run"])
    assert exited.value.code == 2
    assert "--reps 2: need at least 3 repetitions" in capsys.readouterr().err
