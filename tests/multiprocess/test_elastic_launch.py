"""An elastic launch (``--nproc-per-node MIN:MAX``): a worker slot that keeps failing is dropped
and the group trains on with the rest, from its last backup, to the weights of the run without
the failure."""

import json

import pytest
from conftest import assert_same_weights, load_weights
from test_multi_worker import _launch

from stratax._src.launch.config import LaunchConfig, parse_nproc

pytestmark = pytest.mark.timeout(300)


def test_a_slot_lost_for_good_is_dropped_and_training_ends_as_uninterrupted(tmp_path):
    results = {}
    for mode, kwargs in (("none", {}), ("kill9+kill9", {"min_nproc_per_node": 1})):
        out = tmp_path / mode
        out.mkdir()
        results[mode] = _launch(["mwms_backup_program.py", out, out / "backup", mode, 5],
                                tmp_path, nproc_per_node=2, max_restarts=1, timeout=240,
                                run_dir=str(out / "run"), **kwargs)
        assert results[mode].ok, results[mode].summary
    lost = results["kill9+kill9"]
    # Slot 1 failed on the first start and its restart (its one allowed restart), then was
    # dropped: the third start ran worker 0 alone.
    assert lost.restarts == 2 and lost.workers == 1, lost.summary
    assert [f.local_rank for f in lost.failures] == [1, 1], lost.failures
    assert "worker slot(s) [1] were dropped" in lost.summary, lost.summary
    assert not (tmp_path / "kill9+kill9" / "weights_1.npz").exists()
    # One replica instead of two sums the same global batch in another order: float rounding.
    assert_same_weights(load_weights(tmp_path / "kill9+kill9" / "weights_0.npz"),
                        load_weights(tmp_path / "none" / "weights_0.npz"), tol=1e-6)
    events = [json.loads(line) for line in (tmp_path / "kill9+kill9" / "run" / "events.jsonl")
              .read_text().splitlines()]
    restarts = [e for e in events if e["kind"] == "restart"]
    assert [e["workers"] for e in restarts] == [2, 1], restarts
    assert "worker slot 1 failed 2 time(s) and is dropped" in restarts[1]["message"], restarts


def test_the_group_stops_when_fewer_than_the_minimum_would_remain(tmp_path):
    """Local rank 1 fails on every start: with MIN 2 it is never dropped, and its second
    failure (past its one restart) ends the launch."""
    program = tmp_path / "fails.py"
    program.write_text("import os, sys\nsys.exit(3 if os.environ['STRATAX_LOCAL_RANK'] == '1' "
                       "else 0)\n")
    result = _launch([program], tmp_path, nproc_per_node=2, min_nproc_per_node=2,
                     max_restarts=1, timeout=60)
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
    with pytest.raises(ValueError, match="shrinks on one node only"):
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
