"""The DLRM-shaped benchmark (``benchmarks.recsys``): its data, AUC, plan and report in
seconds, and (``-m slow``) its smallest configuration run for real on stratax's systems."""

from __future__ import annotations

import json

import numpy as np
import pytest

import benchmarks.recsys as bench
from benchmarks import recsys_data
from benchmarks.stats import summarize


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
    assert bench.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "3 repetition(s)" in out and "sx-mwms: skipped: tables of 316 MiB" in out
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--reps", "2"])          # a full run needs 3 repetitions
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--systems", "sx-ps,horovod"])


def _fake_run(system, rep):
    rate = {"tf-ps": 10_000.0, "sx-ps": 25_000.0, "sx-mwms": 3_000.0}[system] * (1 + 0.1 * rep)
    run = {"system": system, "rep": rep, "examples_per_s": rate, "auc": 0.70 + 0.001 * rep,
           "examples": 133_120, "train_loss": 0.52, "weights_checksum": "1.0",
           "peak_rss_mib": {"chief0": 600.0, "worker0": 500.0 + rep}}
    if system == "sx-ps":
        run["ps_bytes_per_step"] = 900_000.0
    if system == "sx-mwms":
        run["allreduce_bytes_per_step"] = 20_000_000
    return run


def test_report_table_ratios_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    plan = bench.make_plan(bench.argparse.Namespace(
        quick=True, size=None, systems="tf-ps,sx-ps,sx-mwms", replicated_limit_mib=64, reps=3,
        batch=512, warm_steps=4, spe=1, name=""))
    runs = [_fake_run(s, rep) for rep in range(3) for s in plan.systems]
    runs[-1] = {"system": "sx-mwms", "rep": 2, "error": "boom"}     # one failed repetition
    meta = {"command": "python -m benchmarks.recsys --quick", "finished": "now", "loads": [3.0],
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
    assert "same repetition: sx-ps 2.50, 2.50, 2.50; sx-mwms 0.30, 0.30." in text
    assert json.loads(written[1].read_text())["runs"][-1]["error"] == "boom"
    rows = bench.summarize_runs([{"system": "sx-ps", "error": "x"}], ["sx-ps"])
    assert rows == [{"system": "sx-ps", "reps": 0, "status": "x"}]
    assert summarize([1.0]).median == 1.0


@pytest.mark.slow
def test_smallest_configuration_trains_on_stratax_systems(tmp_path, monkeypatch):
    """Real clusters (chief + 2 workers + 2 ps; 2 MWMS processes): 3-5 min on 2 busy cores."""
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    assert bench.main(["--size", "smoke", "--systems", "sx-ps,sx-mwms", "--batch", "256",
                       "--warm-steps", "2", "--timeout", "400"]) == 0
    report = json.loads((tmp_path / "recsys_smoke.json").read_text())
    runs = {r["system"]: r for r in report["runs"]}
    assert sorted(runs) == ["sx-mwms", "sx-ps"]
    for run in runs.values():
        assert "error" not in run, run
        assert run["examples"] == 32_768 + 2 * 256 and run["examples_per_s"] > 0
        assert run["auc"] > 0.55                             # it learns
    assert sorted(runs["sx-ps"]["peak_rss_mib"]) == ["chief0", "ps0", "ps1", "worker0",
                                                     "worker1"]
    assert sorted(runs["sx-mwms"]["peak_rss_mib"]) == ["worker0", "worker1"]
    assert runs["sx-ps"]["ps_bytes_per_step"] > 0
    assert len(report["meta"]["checksums"]) == 1             # the same initial weights
    assert "| sx-ps |" in (tmp_path / "recsys_smoke.md").read_text()
