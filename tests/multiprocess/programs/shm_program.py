"""What each worker runs in tests/multiprocess/test_shm_collectives.py.

Usage: python shm_program.py OUT_DIR MODE. MODE ``reduce``: ``ctx.all_reduce`` of a tree of
tensors (several dtypes, a tensor larger than one shared-memory slot, small ones sharing a
slot's round, two that fill one) with SUM, MEAN, MAX and MIN, saved to
OUT_DIR/reduce_<worker>.npz. MODE ``stall``: worker 1 never joins the all-reduce; worker 0's
must fail within the timeout (argument 3, seconds), naming it. MODE ``die``: worker 1 kills
itself (SIGKILL) while worker 0 waits in the all-reduce. MODE ``once``: one ``ctx.all_reduce``
per operation, then "traced N" and "done <worker>". MODE ``gather``: the all-gather and the
reduce-scatter of ``fit``'s sharded update, checked against numpy. Mode ``reduce`` also prints
the JAX effects of a program with one shared-memory all-reduce and of one with four. stratax
logs at INFO. Prints "segment NAME", "shm <active>" and "idle threads N" (threads under SCHED_IDLE:
gloo's I/O thread, unless STRATAX_GLOO_IO_PRIORITY says otherwise); after the work, "named
after the set-up <bool>" (whether the segment's name is still in /dev/shm) and "traced N"
(shared-memory all-reduces traced).
"""

import logging
import os
import signal
import sys
import time

import stratax as sx

logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
logging.getLogger("stratax").setLevel(logging.INFO)

strategy = sx.MultiWorkerMirroredStrategy(
    communication_options=sx.CommunicationOptions(
        timeout_seconds=float(sys.argv[3]) if len(sys.argv) > 3 else 30))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from stratax._src.runtime import shm_calls, shm_collectives  # noqa: E402

out_dir, mode = sys.argv[1], sys.argv[2]
worker = strategy.worker_index
print("shm", shm_collectives.state.active, flush=True)
print("segment", shm_collectives.state.name, flush=True)


def _policy(tid):
    """The thread's scheduling policy, or None for one that ended since it was listed."""
    try:
        return os.sched_getscheduler(int(tid))
    except ProcessLookupError:
        return None


print("idle threads", sum(_policy(tid) == os.SCHED_IDLE  # gloo's I/O thread
                          for tid in os.listdir("/proc/self/task")), flush=True)


def still_named():
    return os.path.exists("/dev/shm" + shm_collectives.state.name)



def make(ctx):
    rng = np.random.default_rng(ctx.replica_id_in_sync_group)
    return {"f32": rng.normal(size=(3, 5)).astype(np.float32),
            "big": rng.normal(size=(70_000,)).astype(np.float32),  # > one slot in the test
            "f64": rng.normal(size=(7,)),
            "i32": rng.integers(-50, 50, size=(4,)).astype(np.int32),
            # Two that fit in a slot alone but not together after the small ones: a round
            # is full, the next one starts.
            "w1": rng.normal(size=(100, 100)).astype(np.float32),
            "w2": rng.normal(size=(10_000,)).astype(np.float32),
            **({"f16": rng.normal(size=(6,)).astype(np.float16)}  # not handled by shm: gloo
               if mode == "reduce" else {})}


def step(values):
    ctx = sx.get_replica_context()
    return {op: ctx.all_reduce(op, values) for op in ("sum", "mean", "max", "min")}




def gather_and_scatter():
    """``shm_calls.all_gather`` and ``reduce_scatter`` of operands that share a round
    and of ones chunked over rounds (with 64 KiB slots), checked against numpy; prints
    "gather mismatches N" and "scatter mismatches N"."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from stratax._src.strategies.replica_context import REPLICA_AXIS

    world = strategy.num_replicas_in_sync
    sizes = {"big": (70_000, "float32"), "small": (5, "float32"), "f64": (3, "float64"),
             "i32": (4, "int32")}

    def local(n, dtype, rank, xp):
        return (xp.arange(n) % 997 + 1000 * rank).astype(dtype)

    def body():
        rank = jax.lax.axis_index(REPLICA_AXIS)
        gathered = shm_calls.all_gather([local(n, d, rank, jnp) for n, d in sizes.values()])
        parts = shm_calls.reduce_scatter(
            [local(world * n, d, rank, jnp) for n, d in sizes.values()])
        return gathered, parts

    gathered, parts = jax.jit(jax.shard_map(
        body, mesh=strategy.mesh, in_specs=(), out_specs=(P(), P(REPLICA_AXIS)),
        axis_names=frozenset({REPLICA_AXIS}), check_vma=False))()
    gather_bad = scatter_bad = 0
    for (n, d), whole, part in zip(sizes.values(), gathered, parts, strict=True):
        expected = np.concatenate([local(n, d, r, np) for r in range(world)])
        gather_bad += not np.array_equal(np.asarray(whole.addressable_shards[0].data), expected)
        summed = sum(local(world * n, d, r, np) for r in range(world))
        scatter_bad += not np.array_equal(np.asarray(part.addressable_shards[0].data),
                                          summed[worker * n:(worker + 1) * n])
    print("gather mismatches", gather_bad, flush=True)
    print("scatter mismatches", scatter_bad, flush=True)


if mode == "gather":
    gather_and_scatter()
    print("done", worker, flush=True)
    sys.exit(0)
values = strategy.experimental_distribute_values_from_function(make)
if mode in ("stall", "die"):
    if worker == 1:
        if mode == "die":  # once worker 0 waits in the all-reduce
            time.sleep(1.0)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # alive, but never joins the all-reduce (the test kills it)
    start = time.monotonic()
    try:
        jax.block_until_ready(strategy.run(step, args=(values,)))
        print("no error", flush=True)
    except Exception as error:
        print(f"error after {time.monotonic() - start:.1f} s: {type(error).__name__}: {error}",
              flush=True)
    sys.stdout.flush()
    os._exit(0)
results = strategy.run(step, args=(values,))
if mode == "once":
    jax.block_until_ready(results)
    print("traced", shm_collectives.state.traced_calls, flush=True)
    print("done", worker, flush=True)
    sys.exit(0)
for _ in range(20):  # many rounds: sequence numbers and both buffers in use
    results = strategy.run(step, args=(values,))
flat = {f"{op}/{key}": np.asarray(strategy.experimental_local_results(v)[0])
        for op, tree in results.items() for key, v in tree.items()}
np.savez(os.path.join(out_dir, f"reduce_{worker}.npz"), **flat)
# Two programs with the same shapes dispatched back to back without waiting: each process must
# run them in the same order, or the sums would mix tensors without any error.

def halve(x):
    return sx.get_replica_context().all_reduce("sum", x * 0.5)


def whole(x):
    return sx.get_replica_context().all_reduce("sum", x)


pending = []
for k in range(60):
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx, k=k: np.full((256,), 10 * k + ctx.replica_id_in_sync_group, np.float32))
    pending.append((k, strategy.run(halve if k % 2 else whole, args=(value,))))
mixed = sum(
    not np.all(np.asarray(strategy.experimental_local_results(out)[0])
               == (20 * k + 1) * (0.5 if k % 2 else 1.0))
    for k, out in pending)
print("order mismatches", mixed, flush=True)


def program_effects(fn, argument):
    """JAX's effects of the program ``strategy.run(fn, args=(argument,))`` compiled: they decide
    whether JAX dispatches it from its C++ fast path (none) or through Python."""
    (compiled,) = [c for key, c in strategy._runner._cache.items() if key[0] is fn]
    placed = [strategy._to_global(stacked) for stacked in jax.tree.leaves(argument)]
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding) for a in placed]
    return sorted(type(e).__name__ for e in jax.make_jaxpr(compiled.call)(*shapes).effects)


print("effects of one all-reduce", program_effects(whole, value), flush=True)
print("effects of four", program_effects(step, values), flush=True)
print("traced", shm_collectives.state.traced_calls, flush=True)
print("named after the set-up", still_named(), flush=True)
print("done", worker, flush=True)
