"""Checkpoint formats and their input/output, shared by every strategy.

What a checkpoint is on disk, and how it is written so that a crash never damages the previous
one; not which objects go into it (the strategies' glue: ``keras/callbacks/backup.py``,
``keras/preemption.py``, ``keras/checkpoint_variables.py``, ``keras/saving.py``,
``parameter_server/server_checkpoints.py``).

- ``files``: atomic file writes (a temp file, fsynced, renamed), ``.npz`` with a JSON header,
  locked temporaries and the clean-up of those a dead writer left.
- ``versions``: a directory of ``ckpt-<n>`` versions and the ``latest`` pointer, for training
  state (backups, preemption checkpoints), written by one process or by all.
- ``sharded_state``: state no process holds whole, each process writing its own shards,
  committed when all are on disk; read back into any layout.
- ``entries``: how variables are named and matched in a checkpoint, update counts by rows.
- ``variables_file``: whole variables with their optimizer state in one ``.npz`` file.
- ``sharded_variables``: the same state in row-range parts under ``v<n>`` versions with a
  manifest (written by the parameter servers, each its own shards).
"""
