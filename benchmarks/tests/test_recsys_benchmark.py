"""The DLRM-shaped benchmark (``benchmarks.workloads.recsys``): its data, AUC, plan, report and
goals in seconds, and (``-m slow``) its smallest configuration run for real on stratax's systems
(all variables on the servers, hybrid, MWMS, one process)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import benchmarks.workloads.recsys as bench
from benchmarks.harness.stats import summarize
from benchmarks.workloads import recsys_data


def test_auc_is_the_pairwise_probability_with_ties_halved():
    rng = np.random.default_rng(3)
    labels = rng.random(300) < 0.3
    scores = rng.integers(0, 20, size=300) / 20           # many ties
    pairs = [(p > n) + 0.5 * (p == n) for p in scores[labels] for n in scores[~labels]]
    assert recsys_data.auc(labels, scores) == pytest.approx(np.mean(pairs), abs=1e-12)
    assert recsys_data.auc(labels, labels.astype(float)) == 1.0
    with pytest.raises(ValueError, match="both classes"):
        recsys_data.auc(np.zeros(4), np.arange(4))


def test_data_has_criteo_shape_power_law_ids_and_a_signal():
    config = recsys_data.DataConfig(smallest=10, largest=5_000, train=20_000, held_out=5_000)
    split = recsys_data.generate(config)
    assert recsys_data.generate(config)["train"]["ids"].tobytes() == \
        split["train"]["ids"].tobytes()                   # deterministic in the config
    train = split["train"]
    assert train["dense"].shape == (20_000, 13) and train["dense"].dtype == np.float32
    assert train["ids"].shape == (20_000, 26) and train["ids"].dtype == np.int32
    sizes = config.table_sizes()
    assert sizes[0] == 10 and sizes[-1] == 5_000 and sizes == sorted(sizes)
    assert (train["ids"].min(axis=0) >= 0).all() and (train["ids"].max(axis=0) < sizes).all()
    counts = np.bincount(train["ids"][:, -1], minlength=sizes[-1])
    assert np.sort(counts)[::-1][:10].sum() > 0.1 * len(counts)   # a few hot rows: power law
    assert 0.15 < train["labels"].mean() < 0.45
    # The labels follow the ids: the training set's (smoothed) click rate of each feature's
    # row, summed as log-odds over the 26 features, ranks the held-out clicks.
    held, prior, score = split["held_out"], train["labels"].mean(), 0.0
    for i, rows in enumerate(sizes):
        clicks = np.bincount(train["ids"][:, i], weights=train["labels"][:, 0], minlength=rows)
        seen = np.bincount(train["ids"][:, i], minlength=rows)
        score = score + np.log((clicks + 20 * prior) / (seen + 20) / prior)[held["ids"][:, i]]
    assert recsys_data.auc(held["labels"], score) > 0.65


def test_dry_run_plans_and_skips_replicated_tables_that_do_not_fit(capsys):
    assert bench.main(["--quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "size quick" in out and "1 repetition(s)" in out
    assert "  sx-mwms\n" in out and "recsys_quick.{md,json,png}" in out
    assert "  sx-hybrid\n" in out and "  sx-one (AUC reference" in out
    assert bench.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 repetition(s)" in out and "sx-mwms: skipped: tables of 316 MiB" in out
    assert "  sx-hybrid\n" in out and "  sx-one (AUC reference" in out
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--reps", "2"])          # a full run needs 3 repetitions
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--systems", "sx-ps,horovod"])


def _fake_run(system, rep):
    rate = {"tf-ps": 10_000.0, "sx-ps": 25_000.0, "sx-hybrid": 40_000.0, "sx-mwms": 3_000.0,
            "sx-one": 50_000.0}[system] * (1 + 0.1 * rep)
    auc = 0.70 + 0.001 * rep + {"sx-hybrid": 0.003, "sx-one": 0.0025}.get(system, 0.0)
    run = {"system": system, "rep": rep, "examples_per_s": rate, "auc": auc,
           "examples": 133_120, "train_loss": 0.52, "weights_checksum": "1.0",
           "peak_rss_mib": {"chief0": 600.0, "worker0": 500.0 + rep}}
    if system == "sx-ps":
        run["ps_bytes_per_step"] = 900_000.0
    if system == "sx-hybrid":
        run.update(ps_bytes_per_step=700_000.0, exchange_bytes_per_step=220_808,
                   exchange_bytes_per_worker_step=110_404, exchange_s_per_step=0.004)
    if system == "sx-mwms":
        run["allreduce_bytes_per_step"] = 20_000_000
    return run


def test_report_table_ratios_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    plan = bench.make_plan(bench.argparse.Namespace(
        quick=True, size=None, systems="tf-ps,sx-ps,sx-hybrid,sx-mwms,sx-one",
        replicated_limit_mib=64, reps=3,
        batch=512, warm_steps=4, spe=1, name=""))
    runs = [_fake_run(s, rep) for rep in range(3) for s in plan.systems]
    runs[-2] = {"system": "sx-mwms", "rep": 2, "error": "boom"}     # one failed repetition
    meta = {"command": "python -m benchmarks.workloads.recsys --quick", "finished": "now",
            "loads": [3.0],
            "machine": {"cpu_model": "cpu", "cpu_count": 2, "mem_total_gib": 1},
            "checksums": ["1.0"]}
    written = bench.write_report(runs, plan, meta)
    assert [p.name for p in written] == ["recsys_quick.md", "recsys_quick.json",
                                         "recsys_quick.png"]
    assert written[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = written[0].read_text()
    assert "| sx-ps | 27,500 (25,000-30,000) | 2.50 | 0.7010 (0.7000-0.7020) |" in text
    assert "| tf-ps | 11,000 (10,000-12,000) | 1.00 |" in text
    assert "0.90 MB to and from the ps" in text and "20.00 MB of gradients" in text
    assert "| sx-mwms | 3,150 (3,000-3,300) |" in text      # medians of its 2 good reps
    assert "same repetition: sx-ps 2.50, 2.50, 2.50; sx-hybrid 4.00, 4.00, 4.00; sx-mwms " \
        "0.30, 0.30; sx-one 5.00, 5.00, 5.00." in text
    assert "| sx-one (AUC reference) | 55,000 (50,000-60,000) | 5.00 |" in text
    assert ("0.70 MB to and from the ps (ps counters: rows) + 0.22 MB exchanged among the "
            "workers (0.11 MB fetched per worker, computed); exchange 4.0 ms") in text
    # The goals: hybrid 4.0x tf-ps (>= 3x: met), 1.6x sx-ps (>= 1.5x: met), AUC 0.0005 from
    # the one-process reference (<= 0.002: met).
    assert "| examples/s over tf-ps's | >= 3.0x | 4.00x | [4.00x, 4.00x, 4.00x] | yes |" in text
    assert "| examples/s over sx-ps's | >= 1.5x | 1.60x |" in text
    assert "| held-out AUC gap to sx-one's | <= 0.002 | 0.00050 | [0.00050, 0.00050, " \
        "0.00050] | yes |" in text
    assert json.loads(written[1].read_text())["runs"][-2]["error"] == "boom"
    rows = bench.summarize_runs([{"system": "sx-ps", "error": "x"}], ["sx-ps"])
    assert rows == [{"system": "sx-ps", "reps": 0, "status": "x"}]
    slow = [dict(r, examples_per_s=r["examples_per_s"] / 4) if r["system"] == "sx-hybrid"
            else r for r in runs]
    missing = [r for r in slow if r["system"] != "sx-one"]
    goals = bench.goals(bench.summarize_runs(slow, list(plan.systems)), slow)
    assert [g["met"] for g in goals] == [False, False, True]
    text = "\n".join(bench.goals_text(bench.goals(bench.summarize_runs(
        missing, list(plan.systems)), missing)))
    assert "| held-out AUC gap to sx-one's | <= 0.002 | not measured (sx-one did not run)" in text
    assert summarize([1.0]).median == 1.0


@pytest.mark.slow
def test_smallest_configuration_trains_on_stratax_systems(tmp_path, monkeypatch):
    """Real clusters (chief + 2 workers + 2 ps, twice; 2 MWMS processes; one process): about
    1 min on 2 cores at load 6-7 (sx-ps and sx-mwms alone: 45 s)."""
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    assert bench.main(["--size", "smoke", "--systems", "sx-ps,sx-hybrid,sx-mwms,sx-one",
                       "--batch", "256", "--warm-steps", "2", "--timeout", "400"]) == 0
    report = json.loads((tmp_path / "recsys_smoke.json").read_text())
    runs = {r["system"]: r for r in report["runs"]}
    assert sorted(runs) == ["sx-hybrid", "sx-mwms", "sx-one", "sx-ps"]
    for run in runs.values():
        assert "error" not in run, run
        assert run["examples"] == 32_768 + 2 * 256 and run["examples_per_s"] > 0
        assert run["auc"] > 0.55                             # it learns
    assert sorted(runs["sx-ps"]["peak_rss_mib"]) == ["chief0", "ps0", "ps1", "worker0",
                                                     "worker1"]
    assert sorted(runs["sx-hybrid"]["peak_rss_mib"]) == sorted(runs["sx-ps"]["peak_rss_mib"])
    assert sorted(runs["sx-mwms"]["peak_rss_mib"]) == ["worker0", "worker1"]
    assert sorted(runs["sx-one"]["peak_rss_mib"]) == ["process0"]
    assert runs["sx-ps"]["ps_bytes_per_step"] > 0
    # Hybrid: only the tables' rows cross to the ps (the dense shards are not pulled), and
    # each worker fetches the other's dense gradients: 27,601 float32 values of the DLRM's
    # MLPs (bottom 13-64-16, top 367-64-32-1).
    hybrid = runs["sx-hybrid"]
    assert 0 < hybrid["ps_bytes_per_step"] < runs["sx-ps"]["ps_bytes_per_step"]
    assert hybrid["dense_bytes"] == 27_601 * 4 and hybrid["workers"] == 2
    assert hybrid["exchange_bytes_per_step"] == 2 * 27_601 * 4
    assert hybrid["exchange_s_per_step"] > 0
    # Synchronous hybrid trains what one process trains on the same batches.
    assert abs(hybrid["auc"] - runs["sx-one"]["auc"]) <= 0.002
    assert len(report["meta"]["checksums"]) == 1             # the same initial weights
    text = (tmp_path / "recsys_smoke.md").read_text()
    assert "| sx-ps |" in text and "| sx-one (AUC reference) |" in text
    assert "| held-out AUC gap to sx-one's | <= 0.002 |" in text
