"""The processes of a parameter-server cluster other than the chief: ``sx.Server`` and
what it serves, the ``ps`` task (variable shards, numpy optimizer updates,
snapshots) and the ``worker`` task (exported steps on its own batches, and in hybrid
mode its replica of the dense variables), and how a task finds and outlives its chief.
"""
