"""Per-worker input of a parameter-server cluster: what ``create_per_worker_dataset``
accepts, described on the chief and rebuilt on each worker (no Python crosses the
wire), the chief's live iterators, and arrays shipped once to every worker.
"""
