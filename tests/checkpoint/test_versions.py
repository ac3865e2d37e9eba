"""Checkpoint versions on disk (``checkpoint/versions.py``): a save commits a whole version
or nothing, durably, ``latest`` names only a version inside its directory, and saved entries
pair with variables by name. ``sx.BackupAndRestore``'s own behaviour is tested in
``tests/keras/callbacks/test_backup.py``."""

import os
from pathlib import Path

import keras
import numpy as np
import pytest
from kill_mid_write import kill_while_writing

from stratax._src.checkpoint import versions
from stratax._src.checkpoint.versions import match


def test_entries_pair_by_name_else_by_position_and_mismatches_name_the_missing():
    a, b = np.zeros((2,)), np.ones((3,))
    saved = {"model/net/b": b, "model/net/a": a}
    now = {"model/net/a": keras.Variable(np.zeros(2)), "model/net/b": keras.Variable(np.zeros(3))}
    assert [(v.path, value.shape) for v, value in match(saved, now, "dir", "d")] == \
        [(now["model/net/b"].path, (3,)), (now["model/net/a"].path, (2,))]
    renamed = {"model/net_1/a": now["model/net/a"], "model/net_1/b": now["model/net/b"]}
    assert [value.shape for _, value in match({"arr_0": a, "arr_1": b}, renamed, "d", "d")] == \
        [(2,), (3,)]
    with pytest.raises(ValueError, match=r"not in the checkpoint: \['model/net_1/a'"):
        match(saved, renamed, "d", "d")


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    versions.save(tmp_path, {"w": np.arange(3.0)}, {"step": 1})

    def broken_savez(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError, match="disk full"):
        versions.save(tmp_path, {"w": np.arange(5.0)}, {"step": 2})
    arrays, meta = versions.load(tmp_path)
    assert meta == {"step": 1}
    np.testing.assert_array_equal(arrays["w"], np.arange(3.0))
    assert not list(tmp_path.glob(".staging-*"))


_SAVER = """
import sys
import numpy as np
from stratax._src.checkpoint import versions

versions.save(sys.argv[1], {"w": np.zeros(4 << 20, np.float32)}, {"step": 0})
print("first", flush=True)
step = 1
while True:
    versions.save(sys.argv[1], {"w": np.full(4 << 20, step, np.float32)}, {"step": step})
    step += 1
"""


@pytest.mark.timeout(180)
def test_a_chief_killed_mid_backup_leaves_nothing_after_the_next_save(tmp_path):
    """A real SIGKILL of a process in the middle of a backup: its staging directory stays (it
    cannot remove it); the next save removes it, and the last complete backup loads."""
    leftovers = kill_while_writing(_SAVER, tmp_path, ".staging-")
    assert leftovers, "no kill landed during a backup in 20 tries"
    arrays, meta = versions.load(tmp_path)
    assert float(arrays["w"][0]) == meta["step"]          # the last complete backup
    versions.save(tmp_path, {"w": np.arange(3.0)}, {"step": -1})
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert versions.load(tmp_path)[1] == {"step": -1}


def test_a_version_left_by_a_writer_killed_before_it_became_latest_is_replaced(tmp_path):
    """A writer killed between moving ``ckpt-N`` into place and recording it as latest leaves
    that directory behind; the next save of version N replaces it instead of failing with
    "Directory not empty" (seen in a chaos trial that killed the chief mid-save)."""
    versions.save(tmp_path, {"w": np.zeros(2)}, {"step": 0})
    stale = tmp_path / "ckpt-1"
    stale.mkdir()
    (stale / "state.npz").write_bytes(b"half-written")
    saved = versions.save(tmp_path, {"w": np.ones(2)}, {"step": 1})
    assert saved == stale and versions.latest_version(tmp_path) == stale
    arrays, meta = versions.load(tmp_path)
    np.testing.assert_array_equal(arrays["w"], np.ones(2))
    assert meta == {"step": 1}


@pytest.mark.parametrize("text", ["../elsewhere", "ckpt-x", "/etc"])
def test_a_corrupt_latest_is_an_error_naming_it_never_a_path_elsewhere(tmp_path, text):
    """``latest`` is resolved only to a ckpt-<n> inside the backup directory; anything else is
    an error naming the file and the newest complete version, for a load and for a save."""
    versions.save(tmp_path, {"a": np.ones(2)}, {"epoch": 0})
    versions.save(tmp_path, {"a": np.zeros(2)}, {"epoch": 1})
    (tmp_path.parent / "elsewhere").mkdir(exist_ok=True)
    (tmp_path / "latest").write_text(text)
    for call in (lambda: versions.load(tmp_path),
                 lambda: versions.save(tmp_path, {"a": np.ones(2)}, {"epoch": 2})):
        with pytest.raises(ValueError, match="not the name of a checkpoint version") as err:
            call()
        assert str(tmp_path / "latest") in str(err.value) and "ckpt-1" in str(err.value)


def test_a_version_is_flushed_before_it_becomes_latest(tmp_path, monkeypatch):
    """Data and directories are fsynced before ``latest`` names the version."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    final = versions.save(tmp_path, {"a": np.ones(2)}, {"epoch": 0})
    names = [Path(s).name for s in synced]
    latest = max(i for i, s in enumerate(synced) if ".latest.tmp-" in s)
    for needed in ("state.npz", "meta.json"):
        assert any(n == needed for n in names[:latest]), synced
    assert str(tmp_path) in synced[:latest], synced             # the rename into place
    assert synced[-1] == str(tmp_path), synced                  # the rename of latest
    assert final.name == "ckpt-0"
