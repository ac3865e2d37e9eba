"""Per-worker variables on a real cluster (chief + 2 workers + 1 ps), for
``test_per_worker_variables_on_workers.py``.

Each closure runs two steps; each step adds 1 to the per-worker ``steps`` counter, ``STRIDE``
to the per-worker ``hist`` (another shape and dtype) and pushes an SGD gradient to the ps
variable ``w`` (so per-worker state and parameter-server state travel in the same steps). The
chief prints ``PHASE1 {...}`` after ``CALLS`` closures, waits for the file named in argv[1]
(the test kills and restarts worker 1 meanwhile), runs closures until the restarted worker has
done some, and prints ``RESULT {...}``.
"""

import json
import os
import sys
import time

import numpy as np

import stratax as sx

CALLS, STEPS = 40, 2
HIST0 = np.array([5, 5, 5], np.int32)
STRIDE = np.array([1, 0, 2], np.int32)


def _report(strategy, coordinator, steps, hist, w):
    return {"steps": [int(v) for v in steps.read_all()],
            "hist": [v.tolist() for v in hist.read_all()],
            "worker_steps": [coordinator.stats()[f"worker {i}"].get("steps", 0) for i in (0, 1)],
            "rejoined": sum(s.get("rejoined", 0) for s in coordinator.stats().values()),
            "ps_shards": strategy._ps.clients[0].call("ping").meta["shards"],
            "w_iterations": strategy.optimizer_iterations(w)[0]}


def main():
    marker = sys.argv[1]
    strategy = sx.ParameterServerStrategy(timeout_seconds=30)
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    w = strategy.create_variable(np.zeros(3, np.float32), name="w")
    steps = strategy.create_variable(0, name="steps", per_worker=True)
    hist = strategy.create_variable(HIST0, name="hist", per_worker=True)

    def replica_fn():
        count = strategy.read(steps)
        strategy.assign([steps, hist], [count + 1, strategy.read(hist) + STRIDE])
        strategy.apply_gradients([(np.ones(3, np.float32), w)],
                                 {"class_name": "SGD", "config": {"learning_rate": 0.5}})
        return count

    def step_fn():
        return [strategy.run(replica_fn) for _ in range(STEPS)]

    first = [coordinator.schedule(step_fn) for _ in range(CALLS)]
    coordinator.join()
    seen = [[int(c) for c in r.fetch()] for r in first]
    phase1 = _report(strategy, coordinator, steps, hist, w)
    phase1["consecutive"] = all(b == a + 1 for a, b in seen)  # one closure, one worker
    phase1["created"] = {"steps": [steps.shape, steps.dtype.name, steps.trainable],
                         "hist": [hist.shape, hist.dtype.name], "names": [v.name for v in
                                                                         strategy.variables]}
    print("PHASE1 " + json.dumps(phase1), flush=True)

    deadline = time.monotonic() + 120
    while not os.path.exists(marker):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{marker} did not appear within 120 s")
        time.sleep(0.1)
    before = phase1["worker_steps"]
    calls = 0
    while time.monotonic() < deadline:
        for _ in range(10):
            coordinator.schedule(step_fn)
        calls += 10
        coordinator.join()
        stats = coordinator.stats()
        if stats["worker 1"].get("rejoined") and stats["worker 1"].get("steps", 0) > before[1]:
            break
    report = _report(strategy, coordinator, steps, hist, w)
    report["calls"] = calls
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
