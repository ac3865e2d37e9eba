"""Measurements of stratax's internal components, below the public API on purpose.

Each one times a part that no public call isolates: the parameter servers' transport
(``ps_transport``) and its mutual TLS (``ps_tls``), the servers' optimizer kernels
(``ps_sparse_adam``), the bounds two unit tests check only by order (``timing_bounds``), and
the checkpoint writers against their alternatives (``checkpoint_formats``,
``sharded_checkpoint``). They are the only modules of the benchmarks that import
``stratax._src`` (``benchmarks/tests/test_public_api.py`` holds every other one to the public
API), so a change inside stratax may need a change here; the rest of the benchmarks measure
what a user's program sees.
"""
