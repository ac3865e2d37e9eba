"""The chaos harness (``benchmarks/chaos.py``): its bookkeeping, and real launches struck by a
fault.

The default test kills the chief of a synchronous parameter-server run through `stratax launch`:
the launcher restarts the group, ``sx.BackupAndRestore`` resumes it, and the run must end with
every step applied once and the weights of the uninterrupted run. ``-m slow`` runs a few random
trials per mode; ``python -m benchmarks.chaos`` runs the full count.
"""

import json
from pathlib import Path

import pytest

from benchmarks import chaos

pytestmark = pytest.mark.timeout(900)


def _trial(**fields) -> chaos.Trial:
    base = dict(mode="ps-sync", role="worker0", action="kill", at_step=5, completed=True,
                iterations=chaos.EXPECTED_STEPS, lost_updates=0, extra_updates=0,
                weights_diff=0.0)
    return chaos.Trial(**{**base, **fields})


def test_a_trial_counts_as_lossless_only_when_every_check_holds():
    assert _trial().nothing_lost
    assert _trial(mode="ps-async", weights_diff=None).nothing_lost   # no equality promised
    assert not _trial(completed=False).nothing_lost
    assert not _trial(lost_updates=1).nothing_lost
    assert not _trial(extra_updates=1).nothing_lost                  # applied twice
    assert not _trial(iterations=chaos.EXPECTED_STEPS - 1).nothing_lost
    assert not _trial(weights_diff=1e-3).nothing_lost
    assert not _trial(weights_diff=None).nothing_lost
    assert not _trial(leftover_processes=["ps0 (pid 1)"]).nothing_lost
    assert not _trial(ports_in_use=[2222]).nothing_lost


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


@pytest.mark.slow
@pytest.mark.parametrize("mode", chaos.MODES)
def test_random_faults_lose_nothing(mode, tmp_path):
    assert chaos.main(["--mode", mode, "--trials", "3", "--seed", "11",
                       "--results", str(tmp_path)]) == 0, (tmp_path / "chaos.md").read_text()
