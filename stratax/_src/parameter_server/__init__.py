"""``ParameterServerStrategy`` and ``ClusterCoordinator``: variables on ``ps`` tasks, steps on
workers, scheduled by the chief.

The modules here run on the chief: the strategy, the coordinator and what a scheduled function
records, variables and partitioners, the exported programs, checkpoints, recovery from dead
tasks, and hybrid mode's placement. ``tasks`` holds the other processes (the ``ps`` and
``worker`` servers), ``transport`` the wire format and its carriers (gRPC, a Unix socket with
shared memory on one host), ``inputs`` the per-worker datasets.
"""
