"""What each worker runs in test_shm_collectives.py's transport-choice test.

Usage: python transport_choice_program.py IMPLEMENTATION CONFIG. IMPLEMENTATION is passed to
``CommunicationOptions(implementation=...)`` (``-`` for none), CONFIG to
``sx.config.update("cpu_collectives", ...)`` before the strategy is built (``-`` for none).
Prints "ops <class of strategy.cross_device_ops>", "shm <active>", "sum <all-reduced value>"
and "traced N" (shared-memory all-reduces traced).
"""

import sys

import stratax as sx

implementation, configured = (None if a == "-" else a for a in sys.argv[1:3])
if configured:
    sx.config.update("cpu_collectives", configured)
strategy = sx.MultiWorkerMirroredStrategy(communication_options=sx.CommunicationOptions(
    implementation=implementation, timeout_seconds=60))

import numpy as np  # noqa: E402

from stratax._src.runtime import shm_collectives  # noqa: E402

values = strategy.experimental_distribute_values_from_function(
    lambda ctx: np.full((4,), ctx.replica_id_in_sync_group + 1.0, np.float32))
result = strategy.run(lambda x: sx.get_replica_context().all_reduce("sum", x), args=(values,))
print("ops", type(strategy.cross_device_ops).__name__, flush=True)
print("shm", shm_collectives.state.active, flush=True)
print("sum", float(np.asarray(strategy.experimental_local_results(result)[0])[0]), flush=True)
print("traced", shm_collectives.state.traced_calls, flush=True)
