"""A worker started by another launcher (torchrun, mpirun, a JAX job script): joins its group.

Usage: python launcher_env_program.py. The launcher's variables come from the environment alone;
prints one JSON line: the detected resolver, replicas in sync, chief flag, worker index and the
process indices gathered from every process (proof that the group really communicates), and
the workers the cluster spec lists before the strategy forms the group and after.
"""

import json

import stratax as sx

before = sx.cluster_resolver.detect_cluster_resolver().cluster_spec()
strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(timeout_seconds=60))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

gathered = multihost_utils.process_allgather(jnp.asarray([jax.process_index()]))
print(json.dumps({
    "resolver": type(strategy.cluster_resolver).__name__,
    "replicas": strategy.num_replicas_in_sync,
    "is_chief": strategy.is_chief,
    "worker_index": strategy.worker_index,
    "gathered": sorted(int(i) for i in gathered.ravel()),
    "spec_before": before.as_dict().get("worker", []),
    "spec": strategy.cluster_resolver.cluster_spec().as_dict(),
}), flush=True)
