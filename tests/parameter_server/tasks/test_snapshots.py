"""ps snapshots and checkpoint files in one process: atomic writes, round trips, bad input."""

import json
import os

import numpy as np
import pytest
from kill_mid_write import kill_while_writing

from stratax._src.parameter_server.tasks.ownership import session_digest
from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.tasks.snapshots import Snapshots, write_npz
from stratax._src.parameter_server.transport import wire

# Session ids as a chief makes them (host-pid-random).
_SESSION_A = "hostA-101-" + "0123456789abcdef" * 2
_SESSION_B = "hostB-202-" + "fedcba9876543210" * 2


def _call(server, method, meta, tensors=()):
    reply = wire.decode(server.handle(wire.decode(wire.encode({"method": method, **meta},
                                                              list(tensors)))))
    assert reply.meta["ok"], reply.meta
    return reply


def _trained_server(tmp_path, every, snapshots=None, session=None):
    server = ParameterServer(snapshots or Snapshots(tmp_path, task_index=0, every=every))
    if session is not None:
        server.adopt({"session": session})  # a chief's claim
    _call(server, "create", {"names": ["w"]}, [np.ones((3, 2), np.float32)])
    _call(server, "set_optimizer", {"names": ["w"], "sparse_updates": "lazy",
                                    "spec": {"class_name": "Adam",
                                             "config": {"learning_rate": 0.1}}})
    for step in range(5):
        _call(server, "push", {"step": f"c0:{step}", "dense": ["w"], "sparse": []},
              [np.full((3, 2), step + 1.0, np.float32)])
    return server


def test_snapshot_every_n_pushes_restores_values_slots_and_ledger(tmp_path):
    server = _trained_server(tmp_path, every=2)       # snapshots after pushes 2 and 4
    restored = ParameterServer(Snapshots(tmp_path, task_index=0, every=2))
    shard, old = restored._shards["w"], server._shards["w"]
    assert shard.ledger == {f"c0:{i}" for i in range(4)}            # push 5 came after
    assert shard.optimizer.iterations == 4 and old.optimizer.iterations == 5
    # Re-applying the lost push 5 on the restored ps gives the original state exactly.
    _call(restored, "push", {"step": "c0:4", "dense": ["w"], "sparse": []},
          [np.full((3, 2), 5.0, np.float32)])
    np.testing.assert_array_equal(shard.value, old.value)
    for slot in ("m", "v"):
        np.testing.assert_array_equal(shard.optimizer.slots[slot], old.optimizer.slots[slot])


def test_snapshot_arrays_are_named_by_shard_and_version_1_still_restores(tmp_path):
    _trained_server(tmp_path, every=2)
    with np.load(tmp_path / "ps0.npz") as data:
        assert sorted(data.files) == ["header", "slot/m/w", "slot/v/w", "value/w"]
        header = json.loads(data["header"].tobytes())
        arrays = {k: data[k] for k in data.files if k != "header"}
    # The same snapshot as version 1 wrote it: arrays numbered by shard.
    write_npz(tmp_path / "ps0.npz", {**header, "version": 1},
              {"value/0": arrays["value/w"], "slot/0/m": arrays["slot/m/w"],
               "slot/0/v": arrays["slot/v/w"]})
    shard = ParameterServer(Snapshots(tmp_path, task_index=0, every=2))._shards["w"]
    np.testing.assert_array_equal(shard.value, arrays["value/w"])
    np.testing.assert_array_equal(shard.optimizer.slots["v"], arrays["slot/v/w"])
    assert shard.optimizer.iterations == 4


def test_interrupted_snapshot_keeps_the_previous_one(tmp_path, monkeypatch):
    snapshots = Snapshots(tmp_path, task_index=0, every=2)
    _trained_server(tmp_path, every=2, snapshots=snapshots)
    before = (tmp_path / "ps0.npz").read_bytes()

    def crash(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)    # the temp file is written, not yet renamed
    with pytest.raises(OSError, match="disk full"):
        snapshots.write()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ps0.npz"]   # no temp file left
    assert (tmp_path / "ps0.npz").read_bytes() == before
    restored = ParameterServer(Snapshots(tmp_path, task_index=0, every=2))
    assert restored._shards["w"].optimizer.iterations == 4


def test_snapshot_settings_are_checked(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="every=0"):
        Snapshots(tmp_path, task_index=0, every=0)
    assert Snapshots.configured(0) is None                      # nothing asked for
    assert Snapshots.configured(2, str(tmp_path), 5).path.name == "ps2.npz"
    monkeypatch.setenv("STRATAX_PS_SNAPSHOT_DIR", str(tmp_path))
    monkeypatch.setenv("STRATAX_PS_SNAPSHOT_EVERY", "ten")
    with pytest.raises(ValueError, match="STRATAX_PS_SNAPSHOT_EVERY='ten' is not an integer >= 1"):
        Snapshots.configured(0)
    assert Snapshots.configured(0, every=3).every == 3          # the argument wins
    monkeypatch.setenv("STRATAX_PS_SNAPSHOT_EVERY", "7")
    assert Snapshots.configured(1).every == 7 and Snapshots.configured(1).path.name == "ps1.npz"


_WRITER = """
import sys
import numpy as np
from stratax._src.parameter_server.transport import wire
from stratax._src.parameter_server.tasks.ps import ParameterServer
from stratax._src.parameter_server.tasks.snapshots import Snapshots, write_npz

snapshots = Snapshots(sys.argv[1], task_index=0, every=1000)
server = ParameterServer(snapshots)
server.handle(wire.decode(wire.encode({"method": "create", "names": ["w"]},
                                      [np.ones((4 << 20,), np.float32)])))   # 16 MiB
snapshots.write()
print("first", flush=True)
while True:
    snapshots.write()
"""


@pytest.mark.timeout(120)
def test_a_ps_killed_while_writing_a_snapshot_leaves_no_temp_file(tmp_path):
    """A real SIGKILL of a ps process in the middle of a snapshot write: its temp file stays
    (it cannot remove it), and the next ps started on the directory removes it and loads the
    last complete snapshot. A temp file a live writer holds is kept."""
    from stratax._src.checkpoint import files

    leftovers = kill_while_writing(_WRITER, tmp_path, ".ps0.npz.tmp-")
    assert leftovers, "no kill landed during a snapshot write in 20 tries"
    # A live writer's temp file (held, as write_atomically holds its own) is not touched.
    live = tmp_path / ".ps0.npz.tmp-live"
    live.write_bytes(b"partial")
    with open(live, "rb") as held:
        import fcntl

        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        restored = ParameterServer(Snapshots(tmp_path, task_index=0, every=2))
        assert sorted(p.name for p in tmp_path.iterdir()) == [".ps0.npz.tmp-live", "ps0.npz"]
    np.testing.assert_array_equal(restored._shards["w"].value, np.ones(4 << 20, np.float32))
    assert files.remove_stale_temporaries(tmp_path / "ps0.npz") == [".ps0.npz.tmp-live"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ps0.npz"]


def test_a_snapshot_of_another_chief_session_is_dropped_when_a_new_chief_claims(tmp_path):
    """A ps restarted from its snapshot keeps it for the chief that wrote it (training goes
    on), and drops it for a new chief (which starts from its own values or checkpoint)."""
    _trained_server(tmp_path, every=2, session=_SESSION_A)
    same = ParameterServer(Snapshots(tmp_path, task_index=0, every=2))
    assert "w" in same._shards
    same.adopt({"session": _SESSION_A})
    assert "w" in same._shards
    other = ParameterServer(Snapshots(tmp_path, task_index=0, every=2))
    other.adopt({"session": _SESSION_B})
    assert other._shards == {}
    other.adopt({"session": _SESSION_A})  # the new owner's state is not dropped for the old
    assert other.session_digest == session_digest(_SESSION_A)


def test_a_snapshot_stores_the_sessions_digest_never_the_session_id(tmp_path):
    """The session id is the chief's capability and a snapshot outlives the run: the file
    holds its SHA-256 only, in no form the id can be read from, and a restarted ps still
    recognises the session by it (and by the id that snapshots before the digest held)."""
    _trained_server(tmp_path, every=2, session=_SESSION_A)
    raw = (tmp_path / "ps0.npz").read_bytes()
    secret = _SESSION_A.rsplit("-", 1)[1]  # the random part; host and pid are no secret
    assert secret.encode() not in raw and secret.upper().encode() not in raw
    with np.load(tmp_path / "ps0.npz") as data:
        header = json.loads(data["header"].tobytes())
        arrays = {k: data[k] for k in data.files if k != "header"}
    assert "session" not in header and header["session_sha256"] == session_digest(_SESSION_A)
    for snapshot in (header, {**{k: v for k, v in header.items() if k != "session_sha256"},
                              "session": _SESSION_A}):  # as written before the digest
        write_npz(tmp_path / "ps0.npz", snapshot, arrays)
        restarted = ParameterServer(Snapshots(tmp_path, task_index=0, every=2))
        restarted.adopt({"session": _SESSION_A})
        assert "w" in restarted._shards, snapshot
