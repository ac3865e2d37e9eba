"""The chaos harness (``benchmarks/workloads/chaos.py``): its bookkeeping, and real launches struck
by a fault.

The default tests: the verdict (a trial not struck, or with a step lost or applied twice in a
shard's ledger, fails the run), and one launch struck by a fault per promise: the chief of a
synchronous parameter-server run killed (the group restarts and ``sx.BackupAndRestore``
resumes it), a table built on its servers, a hybrid worker the launcher restarts alone, an
asynchronous ps; each must end with every step applied once and, where the mode promises it,
the weights of the uninterrupted run. ``-m slow`` runs a few random trials per mode;
``python -m benchmarks.workloads.chaos`` runs the full count.
"""

import json
from pathlib import Path

import pytest

from benchmarks.workloads import chaos

pytestmark = pytest.mark.timeout(900)


def _trial(**fields) -> chaos.Trial:
    base = dict(mode="ps-sync", role="worker0", action="kill", at_step=5, struck_at_step=5,
                completed=True, iterations=chaos.EXPECTED_STEPS, lost_updates=0,
                extra_updates=0, weights_diff=0.0)
    return chaos.Trial(**{**base, **fields})


def test_a_trial_counts_as_lossless_only_when_every_check_holds():
    assert _trial().nothing_lost
    assert _trial(mode="ps-async", weights_diff=None).nothing_lost   # no equality promised
    assert not _trial(struck_at_step=None).nothing_lost              # the fault never struck
    assert _trial(role=None, action=None, struck_at_step=None).nothing_lost  # the reference
    assert not _trial(completed=False).nothing_lost
    assert not _trial(lost_updates=1).nothing_lost
    assert not _trial(extra_updates=1).nothing_lost                  # applied twice
    assert not _trial(iterations=chaos.EXPECTED_STEPS - 1).nothing_lost
    assert not _trial(weights_diff=1e-3).nothing_lost
    assert not _trial(weights_diff=None).nothing_lost
    assert not _trial(leftover_processes=["ps0 (pid 1)"]).nothing_lost
    assert not _trial(ports_in_use=[2222]).nothing_lost
    # Hybrid: the variables replicated on the workers are checked on their own.
    assert _trial(mode="hybrid", dense_weights_diff=0.0).nothing_lost
    assert not _trial(mode="hybrid", dense_weights_diff=None).nothing_lost
    assert not _trial(mode="hybrid", role="ps0", dense_weights_diff=0.02).nothing_lost
    # Elastic: a slot dropped then back, two workers at the end, after all three strikes.
    assert _trial(mode="elastic", regrown=True, follow_ups=2).nothing_lost
    assert not _trial(mode="elastic", regrown=False, follow_ups=2).nothing_lost
    assert not _trial(mode="elastic", regrown=True, follow_ups=1).nothing_lost


def _result(ledgers, *, resumed_at=0, iterations=None, duplicates=0):
    """A chief's ``result.json`` with one shard per ledger (a list of closure numbers)."""
    trained = chaos.EXPECTED_STEPS - resumed_at
    return {"iterations": chaos.EXPECTED_STEPS, "restart": 0, "resumed_at": resumed_at,
            "shards": [{"variable": f"v{i}", "duplicates": duplicates,
                        "iterations": resumed_at + (trained if iterations is None
                                                    else iterations),
                        "ledger": None if ledger is None else [f"c{k}:0" for k in ledger]}
                       for i, ledger in enumerate(ledgers)]}


def _judged(result, **fields) -> chaos.Trial:
    trial = _trial(lost_updates=None, extra_updates=None, **fields)
    chaos.judge(trial, result)
    return trial


def test_the_ledgers_judge_lost_and_twice_applied_steps_one_by_one():
    steps = list(range(chaos.EXPECTED_STEPS))
    whole = _judged(_result([steps, steps], duplicates=2))
    assert (whole.lost_updates, whole.extra_updates, whole.skipped_resends) == (0, 0, 4)
    assert whole.nothing_lost
    # Resumed from a backup at step 20: the final run's ledgers hold its 28 steps.
    assert _judged(_result([range(28)], resumed_at=20)).nothing_lost
    # Step 5 lost and another step applied under a new id, on the same shard: the counts agree
    # (48 updates), the ledger does not.
    swapped = _judged(_result([steps, [*steps[:5], *steps[6:], 48]]))
    assert (swapped.lost_updates, swapped.extra_updates) == (1, 1)
    assert not swapped.nothing_lost
    # An update the ledger does not hold (the shard's optimizer counted 49).
    twice = _judged(_result([steps], iterations=chaos.EXPECTED_STEPS + 1))
    assert (twice.lost_updates, twice.extra_updates) == (0, 1)
    # A shard that missed a step while the others have it.
    assert _judged(_result([steps, steps[1:]])).lost_updates == 1
    # Hybrid's dense variables (their ledger stayed on the workers): counted.
    assert _judged(_result([steps, None], iterations=chaos.EXPECTED_STEPS - 2),
                   mode="hybrid").lost_updates == 2


def _fake_launches(monkeypatch, result, *, strike=True):
    """``run_trial`` without a launch: the trial gets ``result`` as its chief's, and is struck
    or not."""
    def run_trial(trial, work_dir, reference):
        trial.exit_code, trial.completed, trial.weights_diff = 0, True, 0.0
        trial.struck_at_step = trial.at_step if strike else None
        chaos.judge(trial, result)
        return trial

    monkeypatch.setattr(chaos, "run_trial", run_trial)
    monkeypatch.setattr(chaos, "reference_weights", lambda mode, work_dir: {})


@pytest.mark.parametrize("mode", ["ps-sync", "ps-async"])
def test_the_default_plan_fails_on_a_trial_not_struck_or_a_step_applied_twice(
        monkeypatch, tmp_path, mode):
    steps = list(range(chaos.EXPECTED_STEPS))
    args = ["--mode", mode, "--trials", "2", "--results", str(tmp_path)]
    _fake_launches(monkeypatch, _result([steps]))
    assert chaos.main(args) == 0
    _fake_launches(monkeypatch, _result([steps]), strike=False)
    assert chaos.main(args) == 1
    summary = json.loads((tmp_path / "chaos.json").read_text())["summary"]
    assert [(r["completed"], r["nothing_lost"]) for r in summary] == [(1, 0), (1, 0)]
    _fake_launches(monkeypatch, _result([[*steps[:7], *steps[8:], 48]]))
    assert chaos.main(args) == 1
    _fake_launches(monkeypatch, _result([steps], iterations=chaos.EXPECTED_STEPS + 1))
    assert chaos.main(args) == 1


def test_a_parameter_server_kill_in_async_mode_may_lose_only_what_followed_its_snapshot():
    ps_kill = dict(mode="ps-async", role="ps0", weights_diff=None)
    assert chaos.passed(_trial(**ps_kill, lost_updates=2, iterations=chaos.EXPECTED_STEPS - 2))
    assert chaos.passed(_trial(**ps_kill, lost_updates=chaos.SNAPSHOT_EVERY))
    assert not chaos.passed(_trial(**ps_kill, lost_updates=chaos.SNAPSHOT_EVERY + 1))
    assert not chaos.passed(_trial(**ps_kill, lost_updates=1, extra_updates=1))
    assert not chaos.passed(_trial(**ps_kill, lost_updates=1, struck_at_step=None))
    assert not chaos.passed(_trial(**{**ps_kill, "role": "worker0"}, lost_updates=1))
    assert chaos.verdict([]) == 1                                     # nothing tried


def test_the_plan_is_reproducible_and_strikes_every_role_mid_run():
    first = chaos.plan(list(chaos.MODES), 40, seed=5)
    assert first == chaos.plan(list(chaos.MODES), 40, seed=5)
    assert first != chaos.plan(list(chaos.MODES), 40, seed=6)
    for mode in chaos.MODES:
        trials = [t for t in first if t.mode == mode]
        assert {t.role for t in trials} == set(chaos.ROLES[mode])
        assert {t.action for t in trials} == set(chaos.ACTIONS)
        assert all(2 <= t.at_step < chaos.EXPECTED_STEPS for t in trials)


def test_the_summary_groups_trials_by_fault():
    rows = chaos.summarize([_trial(seconds=10), _trial(seconds=30, lost_updates=2),
                            _trial(role="ps0", seconds=5)])
    assert [(r["role"], r["trials"], r["nothing_lost"], r["max_lost_updates"], r["median_s"])
            for r in rows] == [("ps0", 1, 1, 0, 5), ("worker0", 2, 1, 2, 20)]


@pytest.mark.slow  # the chief of the table run below, killed the same way, is the default case
def test_a_killed_parameter_server_chief_resumes_from_its_backup_exactly(tmp_path):
    reference = chaos.reference_weights("ps-sync", tmp_path)
    trial = chaos.run_trial(chaos.Trial("ps-sync", "chief0", "kill", 18), tmp_path, reference)
    assert trial.struck_at_step is not None and trial.restarts == 1, trial
    # Every step applied once on every shard, the uninterrupted run's weights (Adam's slots
    # came back from the backup onto the new servers), nothing left running.
    assert trial.nothing_lost, trial


@pytest.fixture(scope="module")
def table_reference(tmp_path_factory):
    """The uninterrupted ps-table run's weights."""
    return chaos.reference_weights("ps-table", tmp_path_factory.mktemp("ps-table"))


@pytest.mark.parametrize("role,at_step", [("chief0", 14), ("ps0", 30)])
def test_a_table_built_on_its_servers_resumes_exactly_after_a_kill(role, at_step, tmp_path,
                                                                    table_reference):
    """The table and its slots live only on the servers; a killed chief (or ps) comes back
    through the backup's sharded checkpoint, to the uninterrupted run's weights."""
    trial = chaos.run_trial(chaos.Trial("ps-table", role, "kill", at_step), tmp_path,
                            table_reference)
    assert trial.struck_at_step is not None and trial.nothing_lost, trial
    servers = Path(trial.run_dir) / "backup" / "servers"
    manifest = json.loads((servers / (servers / "latest").read_text() / "manifest.json")
                          .read_text())
    assert [e["name"] for e in manifest["variables"]] == ["embedding/embeddings"]
    assert manifest["variables"][0]["slots"] == ["m", "v"]
    # The group restarted (a restarted ps fails a synchronous run, rather than lose the steps
    # after its snapshot) and the new chief read the table back from the servers' checkpoint.
    assert trial.restarts >= 1, trial


def test_a_hybrid_worker_killed_is_restarted_by_the_launcher_and_loses_nothing(tmp_path):
    """docs/recommenders.md: `stratax launch` restarts a failed hybrid-mode worker alone, the
    chief takes it back, and the run ends with the uninterrupted run's weights (the dense
    variables replicated on the workers included) and every table step applied once."""
    reference = chaos.reference_weights("hybrid", tmp_path)
    trial = chaos.run_trial(chaos.Trial("hybrid", "worker1", "kill", 20), tmp_path, reference)
    assert trial.nothing_lost and trial.dense_weights_diff <= chaos.WEIGHTS_EQUAL, trial
    log = (Path(trial.run_dir) / "launch.log").read_text()
    assert "restarting worker 1 alone" in log, log[-3000:]
    assert trial.restarts == 0, trial                # the group went on; only the worker restarted


def test_a_killed_asynchronous_parameter_server_loses_at_most_its_snapshot_interval(tmp_path):
    """ps-async: a ps SIGKILLed mid-run is restarted alone and reloads its snapshot, losing
    at most the ``SNAPSHOT_EVERY`` steps after it; where its restart outlasts the workers'
    ``timeout_seconds`` (a loaded box), the step fails and the group resumes from its backup,
    losing nothing. Either way no step is applied twice (the ledgers)."""
    trial = chaos.run_trial(chaos.Trial("ps-async", "ps0", "kill", 22), tmp_path, None)
    assert trial.struck and trial.completed, trial
    assert trial.extra_updates == 0 and trial.lost_updates <= chaos.SNAPSHOT_EVERY, trial
    assert chaos.passed(trial), trial


@pytest.mark.slow
@pytest.mark.parametrize("mode", chaos.MODES)
def test_random_faults_lose_nothing(mode, tmp_path):
    assert chaos.main(["--mode", mode, "--trials", "3", "--seed", "11",
                       "--results", str(tmp_path)]) == 0, (tmp_path / "chaos.md").read_text()
