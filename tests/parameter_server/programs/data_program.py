"""Per-worker data as TensorFlow's coordinator tests use it: one program for every role.

Run by ``test_per_worker_data.py``; the chief runs ``api`` or ``lifecycle`` (argv[1]) and
prints one JSON line ``RESULT {...}``. ``lifecycle`` asks the test to kill and restart worker 1:
it prints ``KILL worker1`` / ``RESTART worker1`` and waits for the file ``killed`` /
``restarted`` in ``$HANDSHAKE_DIR``.
"""

import gc
import itertools
import json
import os
import sys
import time

import numpy as np

import stratax as sx

strategy = None  # the chief's ParameterServerStrategy (main); per_worker_dataset_fn reads it


def tagged(input_context):
    """Batches ``[1000 * pipeline id + step, step]`` and the number of pipelines."""
    base = 1000 * input_context.input_pipeline_id
    for step in itertools.count():
        yield (np.array([base + step, step], np.float32),
               np.array([input_context.num_input_pipelines], np.int32))


def per_worker_dataset_fn():
    """The parameter-server guide's per-worker function: runs on each worker."""
    return strategy.distribute_datasets_from_function(tagged)


def _shuffled():
    import tensorflow as tf

    return tf.data.Dataset.range(100).map(lambda i: tf.cast(i, tf.float32)).shuffle(100).batch(1)


def shuffled_fn():
    """TensorFlow's testDatasetsShuffledDifferently: experimental_distribute_dataset inside."""
    return strategy.experimental_distribute_dataset(_shuffled())


def identity(*batch):
    return batch


def read_one(iterator):
    return strategy.run(identity, args=next(iterator))


def read_tagged(tags, iterator):
    """The worker's pipeline id (from ``tags``) and the next batch of ``iterator``."""
    (tag, _), value = next(tags), next(iterator)
    return strategy.run(identity, args=(tag, value))


def read_two(first, second):
    """Two iterators in one function: a, b, then a again."""
    (a1, _), (b1, _), (a2, _) = next(first), next(second), next(first)
    return strategy.run(identity, args=(a1, b1, a2))


def _by_worker(values):
    """``{pipeline id: sorted steps}`` of ``[1000 * id + step, step]`` rows."""
    out = {}
    for row in values:
        out.setdefault(str(int(row[0]) // 1000), []).append(int(row[1]))
    return {k: sorted(v) for k, v in out.items()}


def _run_all(coordinator, fn, args, count):
    remotes = [coordinator.schedule(fn, args=args) for _ in range(count)]
    coordinator.join()
    return [remote.fetch() for remote in remotes]


def api(coordinator):
    import tensorflow as tf

    result = {}
    # The guide: strategy.distribute_datasets_from_function inside the per-worker function, on
    # a generic worker (worker 0) and on one running this program (worker 1).
    guide = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    result["guide_spec"] = [[list(s.shape), s.dtype.name] for s in guide.element_spec]
    outputs = _run_all(coordinator, read_one, (iter(guide),), 12)
    result["guide_pipelines"] = sorted({int(n[0]) for _, n in outputs})
    result["guide"] = _by_worker([x for x, _ in outputs])

    # strategy.distribute_datasets_from_function called on the chief.
    on_chief = strategy.distribute_datasets_from_function(tagged)
    try:
        iter(on_chief)
        result["iterated_on_chief"] = ""
    except ValueError as err:  # TensorFlow's type
        result["iterated_on_chief"] = str(err)
    outputs = _run_all(coordinator, read_one,
                       (iter(coordinator.create_per_worker_dataset(on_chief)),), 8)
    result["from_function_on_chief"] = _by_worker([x for x, _ in outputs])

    # A tf.data.Dataset object: every worker iterates a copy (sent as its graph).
    dataset = tf.data.Dataset.range(1000).map(
        lambda i: (tf.cast(tf.stack([i, i]), tf.float32), tf.constant([1], tf.int32)))
    for name, source in [("tf_dataset", dataset),
                         ("distributed", strategy.experimental_distribute_dataset(dataset))]:
        per_worker = coordinator.create_per_worker_dataset(source)
        per_worker.build()
        result[f"{name}_spec"] = [[list(s.shape), s.dtype.name] for s in per_worker.element_spec]
        outputs = _run_all(coordinator, read_one, (iter(per_worker),), 10)
        result[name] = sorted(int(x[1]) for x, _ in outputs)

    # Two iterators as two arguments of one scheduled function, both advancing.
    first = iter(coordinator.create_per_worker_dataset(tagged))
    second = iter(coordinator.create_per_worker_dataset(tagged))
    outputs = _run_all(coordinator, read_two, (first, second), 6)
    result["two"] = [[int(v) for v in (*a1, *b1, *a2)] for a1, b1, a2 in outputs]

    # Shuffled without a seed: every worker's copy has its own order (function or object).
    tags = iter(coordinator.create_per_worker_dataset(tagged))
    for name, source in [("shuffled_fn", shuffled_fn), ("shuffled_object", _shuffled())]:
        iterator = iter(coordinator.create_per_worker_dataset(source))
        orders = {}
        for _ in range(40):
            for tag, value in _run_all(coordinator, read_tagged, (tags, iterator), 4):
                orders.setdefault(int(tag[0]) // 1000, []).append(float(value[0]))
            if len(orders) == 2 and min(map(len, orders.values())) >= 5:
                break
        result[name] = [orders[w][:5] for w in sorted(orders)]

    refusals = {}
    for name, source in [
            ("number", 42),
            ("generator", tf.data.Dataset.from_generator(
                lambda: iter([1, 2]), output_signature=tf.TensorSpec((), tf.int32)))]:
        try:
            coordinator.create_per_worker_dataset(source)
            refusals[name] = ""
        except (TypeError, ValueError) as err:
            refusals[name] = f"{type(err).__name__}: {err}"
    result["refusals"] = refusals
    return result


def _held(worker):
    return strategy._worker_clients[worker].call("ping").meta["iterators"]


def _wait_for(what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not what() and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(what())


def _handshake(step):
    print(f"{step.upper()} worker1", flush=True)
    path = os.path.join(os.environ["HANDSHAKE_DIR"], {"kill": "killed",
                                                      "restart": "restarted"}[step])
    if not _wait_for(lambda: os.path.exists(path), timeout=120):
        raise TimeoutError(f"the test did not {step} worker 1")


def lifecycle(coordinator):
    result = {}
    # Many iterators, each used, then all but two dropped: the chief's registry and the
    # workers' held iterators shrink to the live ones.
    dataset = coordinator.create_per_worker_dataset(tagged)
    iterators = [iter(dataset) for _ in range(12)]
    for iterator in iterators:
        _run_all(coordinator, read_one, (iterator,), 1)
    kept = iterators[:2]
    result["held_before"] = [len(_held(0)), len(_held(1))]
    result["registry_before"] = len(coordinator._iterators.live())
    del iterators, iterator
    gc.collect()
    kept_names = sorted(it.name for it in kept)
    # Released in the background: the registry first, then each worker's copy.
    result["released"] = _wait_for(lambda: sorted(coordinator._iterators.live()) == kept_names
                                   and _held(0) == _held(1) == kept_names)
    result["registry_after"] = sorted(coordinator._iterators.live())
    result["held_after"] = [_held(0), _held(1)]

    # Worker 1 dies (not yet noticed): creating a dataset and an iterator does not fail.
    _handshake("kill")
    late_dataset = coordinator.create_per_worker_dataset(tagged)
    late_dataset.build()
    late = iter(late_dataset)
    outputs = _run_all(coordinator, read_one, (late,), 6)
    result["while_down"] = _by_worker([x for x, _ in outputs])

    # Worker 1 comes back: it is given the live iterators (two kept, one late), no others.
    _handshake("restart")
    stats = lambda: coordinator.stats()["worker 1"]  # noqa: E731
    values = []  # every batch read from `late` from now on, by either worker
    deadline = time.monotonic() + 60
    while not stats().get("rejoined") and time.monotonic() < deadline:
        # Worker 1's thread takes one, finds the worker dead and waits for its return.
        values += [x for x, _ in _run_all(coordinator, read_one, (late,), 1)]
        time.sleep(0.5)
    result["rebuilt"] = _held(1)
    result["live"] = sorted([*kept_names, late.name])
    before = stats().get("steps", 0)
    deadline = time.monotonic() + 60
    while stats().get("steps", 0) < before + 3 and time.monotonic() < deadline:
        values += [x for x, _ in _run_all(coordinator, read_one, (late,), 4)]
    result["after_restart"] = _by_worker(values)
    return result


def main():
    global strategy
    strategy = sx.ParameterServerStrategy(timeout_seconds=30)
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    scenario = {"api": api, "lifecycle": lifecycle}[sys.argv[1]]
    print("RESULT " + json.dumps(scenario(coordinator)), flush=True)


if __name__ == "__main__":
    main()
