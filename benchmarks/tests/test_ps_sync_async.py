"""The sync-vs-async benchmark's plumbing on fake results: plan, table, plots. No cluster runs."""

from __future__ import annotations

import benchmarks.workloads.ps_sync_async as bench


def _fake(task, mode, workers, straggler, rep):
    """A run whose loss halves every 'update'; sync is slowed W-fold by a straggler."""
    batches = 64
    updates = batches // workers if mode == "sync" else batches
    seconds_per_update = 0.01 * (3 if straggler and mode == "sync" else 1) * (1 + 0.1 * rep)
    trace = [[i * seconds_per_update, i, 2.0 * 0.97 ** (i * (workers if mode == "sync" else 1))]
             for i in range(0, updates + 1, 8)]
    steps = {f"worker {w}": updates if mode == "sync" else batches // workers
             for w in range(workers)}
    return {"task": task, "mode": mode, "workers": workers, "straggler": straggler,
            "batches": batches, "wall": trace[-1][0], "updates": updates,
            "examples": batches * 32, "trace": trace, "per_worker_steps": steps,
            "slowest": f"worker {workers - 1}" if straggler else None,
            "straggler_flagged": straggler}


def test_report_writes_table_and_plots(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "RESULTS", tmp_path)
    results = [_fake(t, m, w, s, rep) for rep in range(3) for t in bench.TASKS
               for w, s in bench.plan(full=True) for m in bench.MODES]
    written = bench.write_report(results, "# fake")
    assert sorted(p.name for p in written) == [
        "ps_sync_async.json", "ps_sync_async.md", "ps_sync_async_digits.png",
        "ps_sync_async_embedding.png"]
    for png in written[2:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = (tmp_path / "ps_sync_async.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| digits")]
    assert len(rows) == 10                                    # 5 configurations x 2 modes
    straggled_sync = next(r for r in rows if "| 4 + straggler | sync |" in r)
    # median of the 3 repetitions' walls (reps 0, 1, 2 -> x1.0, 1.1, 1.2): rep 1
    assert "| 0.53 (0.48-0.58) |" in straggled_sync           # 16 updates x 0.03 s x 1.1 (+/-10%)
    assert "worker 3 (straggler)" in straggled_sync


def test_time_to_target_and_summary():
    trace = [[0.0, 0, 2.0], [1.0, 10, 0.5], [2.0, 20, 0.2]]
    assert bench.time_to(trace, 0.5) == 1.0 and bench.time_to(trace, 0.1) is None
    rows = bench.summarize([_fake("digits", m, 2, False, 0) for m in bench.MODES])
    assert [r["mode"] for r in rows] == ["sync", "async"]
    target = max(r["final_loss"] for r in rows)               # every run reaches the target
    assert all(r["target"] == target and r["time_to_target"] is not None for r in rows)


def test_dry_run_prints_the_plan(capsys):
    assert bench.main(["--quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "16 configurations x 1 repetitions, 768 batches each" in out
    assert "embedding: async, 4 workers + straggler" in out
