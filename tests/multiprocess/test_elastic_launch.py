"""An elastic launch (``--nproc-per-node MIN:MAX``): a worker slot that keeps failing is dropped
and the group trains on with the rest, from its last backup, takes the slot back at a later
restart, and ends at the weights of the run without the failures."""

import json

import mwms_backup_program
import numpy as np
import pytest
import tpu_pod_program
from conftest import NOT_INHERITED, assert_same_weights, load_weights
from test_multi_worker import _launch
from test_tpu_pod import _assert_equal

import stratax as sx
from stratax._src.distributed_input.global_batch import check_divisible
from stratax._src.launch.config import LaunchConfig, parse_nproc
from stratax._src.launch.membership import Membership, batch_split_error

pytestmark = pytest.mark.timeout(300)


def test_a_slot_lost_then_back_shrinks_and_regrows_the_group_to_the_uninterrupted_weights(
        tmp_path, one_process_backup_weights):
    out = tmp_path / "lost"
    out.mkdir()
    lost = _launch(["mwms_backup_program.py", out, out / "backup", "kill9+kill9+kill9@0", 5],
                   tmp_path, nproc_per_node=2, min_nproc_per_node=1, max_restarts=1,
                   timeout=240, run_dir=str(out / "run"))
    assert lost.ok, lost.summary
    # Slot 1 failed on the first start and its restart (its one allowed restart) and was
    # dropped: the third start ran worker 0 alone. Worker 0 then failed, and at that restart
    # slot 1 came back: the fourth start, of two workers again, finished.
    assert lost.restarts == 3 and lost.workers == 2, lost.summary
    assert [f.local_rank for f in lost.failures] == [1, 1, 0], lost.failures
    assert "worker slot(s) [1] were dropped and rejoined" in lost.summary, lost.summary
    # Backups written by 2, then 1, then 2 workers: a sum over another number of replicas
    # has another order, float rounding.
    for worker in (0, 1):
        assert_same_weights(load_weights(out / f"weights_{worker}.npz"),
                            one_process_backup_weights, tol=1e-6)
    events = [json.loads(line)
              for line in (out / "run" / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [e["workers"] for e in restarts] == [2, 1, 2], restarts
    assert "worker slot 1 failed 2 time(s) and is dropped" in restarts[1]["message"], restarts
    assert "worker slot(s) [1] rejoin" in restarts[2]["message"], restarts
    assert [len(e["pids"]) for e in events if e["kind"] == "start"] == [2, 2, 1, 2], events


def test_a_backup_resumed_by_three_workers_then_by_one_ends_uninterrupted(
        tmp_path, monkeypatch):
    """The guarantee behind an elastic launch, in real processes: one backup directory carried
    through launches of 2, 3 and 1 workers, the first two killed (worker 0, kill -9, once its
    backups are committed) a few steps after they resumed, ends at the weights of one
    uninterrupted process. With the 2 -> 1 -> 2 run above, 1, 2 and 3 workers each resume a
    backup another count wrote, and each count's backup is resumed by another;
    ``tests/keras/callbacks/test_backup_resume_counts.py`` runs every ordered pair in one
    process. The global batch of 24 splits over each count."""
    reference = mwms_backup_program.train(sx.MirroredStrategy(["cpu:0"]), batch=24).get_weights()
    for name in NOT_INHERITED:  # the workers have one device each, not this process' eight
        monkeypatch.delenv(name, raising=False)
    backup, resumed_at = tmp_path / "backup", []
    for workers, kill_at in [(2, 5), (3, 10), (1, None)]:  # 39 steps in all
        result = _launch(["mwms_backup_program.py", tmp_path, backup,
                          "kill9w@0" if kill_at else "none", kill_at or 0, "batch=24"],
                         tmp_path, nproc_per_node=workers, max_restarts=0, timeout=240)
        assert result.ok == (kill_at is None), result.summary
        starts = {line.split()[-1] for line in result.outputs[0] if "start iterations" in line}
        resumed_at.append(int(starts.pop()))
    # Each launch resumed from the last backup (every 3 steps) of the launch before it, which
    # was killed once its writes were committed: at global steps 5 and 13 of 39.
    assert resumed_at == [0, 3, 12], resumed_at
    assert_same_weights(load_weights(tmp_path / "weights_0.npz"), reference, tol=1e-5)


def test_an_emulated_tpu_pod_that_loses_a_host_for_good_goes_on_as_one_host(tmp_path):
    """Elastic under ``TPUStrategy``: a pod of 2 emulated hosts x 4 cores (each launched
    process a host, replicas of 2 cores, a kernel held in parts by the hosts); host 1 is
    SIGKILLed mid-epoch with no restarts allowed, so its slot is dropped and the pod restarts
    as 1 host (2 replicas) from the backup the 2 hosts wrote in parts. It ends at one device's
    uninterrupted weights, validation metrics, ``evaluate`` and ``predict``."""
    env = {"STRATAX_TPU_EMULATION": "4", "STRATAX_CPU_DEVICES": "4", "XLA_FLAGS": ""}
    result = _launch(["tpu_pod_program.py", tmp_path, tmp_path / "backup"], tmp_path, env=env,
                     nproc_per_node=2, min_nproc_per_node=1, max_restarts=0, timeout=240)
    assert result.ok and result.restarts == 1 and result.workers == 1, result.summary
    (killed,) = result.failures
    assert (killed.signal_name, killed.local_rank) == ("SIGKILL", 1)
    with np.load(tmp_path / "host_0.npz") as data:
        one_host = dict(data)
    assert (int(one_host["hosts"]), int(one_host["replicas"])) == (1, 2)
    _assert_equal(tpu_pod_program.run(sx.OneDeviceStrategy("cpu:0")), one_host,
                  "the pod after losing host 1", resumed=True)


def test_a_slot_that_never_recovers_sits_out_ever_more_restarts():
    """Slot 1 fails at every start it is in, slot 0 at the others. Once dropped, slot 1 sits
    out 1, 2, 4, then 8 starts between its tries: it costs the group one restart per doubling
    of the restarts the other slot causes, not one in two."""
    members = Membership(maximum=2, minimum=1, max_restarts=20)
    with_slot_1 = []
    for restart in range(40):
        if 1 in members.slots:
            with_slot_1.append(restart)
            step = members.after_failure(members.slots.index(1), restart)
            assert step == ("restart" if restart < 20 else "drop"), (restart, step)
        else:
            assert members.after_failure(0, restart) == "restart"
            assert members.slots == ([0, 1] if members.rejoined else [0]), members
    assert with_slot_1 == [*range(21), 22, 25, 30, 39], with_slot_1


def test_a_batch_split_error_is_the_groups_and_picks_a_count_that_splits_it(tmp_path):
    """Every worker fails because the global batch of 16 does not split over 3 replicas: a
    launch with N workers stops at once, restarts left or not, quoting the error; an elastic
    one restarts at once with 2 workers, which split it, and charges no slot."""
    program = tmp_path / "batch.py"
    program.write_text(
        "import os, sys\n"
        "n = int(os.environ['STRATAX_NUM_PROCESSES'])\n"
        "if 16 % n:\n"
        "    raise ValueError(f'Global batch size 16 does not split over {n} replicas; use a '\n"
        "                     f'multiple of {n}, e.g. `model.fit(..., batch_size=15)`.')\n"
        "open(os.path.join(sys.argv[1], os.environ['STRATAX_PROCESS_ID']), 'w').close()\n")
    fixed = _launch([program, tmp_path], tmp_path, nproc_per_node=3, max_restarts=2,
                    timeout=180)
    assert fixed.exit_code == 1 and fixed.restarts == 0, fixed.summary
    assert ('the workers fail with "Global batch size 16 does not split over 3 replicas" and '
            "a restart would fail the same way") in fixed.summary, fixed.summary
    elastic = _launch([program, tmp_path], tmp_path, nproc_per_node=3, min_nproc_per_node=1,
                      max_restarts=0, timeout=180)
    assert elastic.ok and elastic.restarts == 1 and elastic.workers == 2, elastic.summary
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["0", "1"]
    narrow = _launch([program, tmp_path], tmp_path, nproc_per_node=3, min_nproc_per_node=3,
                     max_restarts=2, timeout=180)
    assert narrow.exit_code == 1 and narrow.restarts == 0, narrow.summary
    assert "no number of workers between the minimum" in narrow.summary, narrow.summary


def test_the_launcher_reads_strataxs_own_batch_split_error():
    with pytest.raises(ValueError) as error:
        check_divisible(16, 3, hint="batch_size={batch}")
    assert batch_split_error(["Traceback (most recent call last):",
                              f"ValueError: {error.value}"]) == (16, 3)
    assert batch_split_error(["ValueError: something else"]) is None


def test_the_group_stops_when_fewer_than_the_minimum_would_remain(tmp_path):
    """Local rank 1 fails on every start: with MIN 2 it is never dropped, and its second
    failure (past its one restart) ends the launch."""
    program = tmp_path / "fails.py"
    program.write_text("import os, sys\nsys.exit(3 if os.environ['STRATAX_LOCAL_RANK'] == '1' "
                       "else 0)\n")
    result = _launch([program], tmp_path, nproc_per_node=2, min_nproc_per_node=2,
                     max_restarts=1, timeout=180)
    assert result.exit_code == 3 and result.restarts == 1 and result.workers == 2, result.summary
    assert [f.local_rank for f in result.failures] == [1, 1], result.summary


@pytest.mark.parametrize("text, message", [
    ("2:1", "the minimum is above the maximum"),
    ("0:2", "min_nproc_per_node must be >= 1"),
    ("a:2", "N or MIN:MAX"),
])
def test_bad_elastic_ranges_name_the_value(text, message):
    with pytest.raises(ValueError, match=message):
        LaunchConfig(*_range(text))


def test_an_elastic_group_is_one_node():
    with pytest.raises(ValueError, match="worker by worker on one node only"):
        LaunchConfig(nproc_per_node=2, min_nproc_per_node=1, nnodes=2, coordinator="h:1")


def _range(text):
    minimum, maximum = parse_nproc(text)
    return maximum, minimum


def test_the_command_line_takes_torchruns_min_max():
    import argparse

    from stratax._src.launch.arguments import add_launch_arguments

    parser = argparse.ArgumentParser()
    add_launch_arguments(parser)
    args = parser.parse_args(["--nproc-per-node", "1:3", "train.py"])
    assert (args.min_nproc_per_node, args.nproc_per_node) == (1, 3)
    args = parser.parse_args(["--nproc-per-node", "2", "train.py"])
    assert (args.min_nproc_per_node, args.nproc_per_node) == (None, 2)
