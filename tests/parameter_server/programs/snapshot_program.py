"""Parameter-server failure: chief + 2 workers + 1 ps snapshotting every EVERY pushes.

After STARTED the test SIGKILLs ps 0 and restarts it (same address and snapshot directory);
training continues without restarting the chief. Then, after PHASE2, the test kills ps 0 for
good and the chief times how long the error naming it takes to reach ``join()``.
"""

import json
import time

import linear
import numpy as np

import stratax as sx

STEPS, CALLS, TIMEOUT = 2, 1000, 10


def main():
    strategy = sx.ParameterServerStrategy(timeout_seconds=TIMEOUT)
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    w, step_fn, iterator = linear.start(strategy, coordinator, {
        "class_name": "Adam", "config": {"learning_rate": 0.01}}, STEPS)
    remotes = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(CALLS - 1)]
    done = [time.monotonic()]
    for remote in remotes:            # completion times in order: the largest gap is the stall
        remote.fetch(timeout=120)
        done.append(time.monotonic())
    coordinator.join()
    result = {"scheduled": CALLS * STEPS, "iterations": strategy.optimizer_iterations(w),
              "ledger": strategy.applied_steps(w)[0], "stall_s": float(np.diff(done).max()),
              "phase1_s": done[-1] - done[0]}
    print("PHASE2", flush=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:   # until the test has killed ps 0 for good
        try:
            strategy._ps.clients[0].call("ping", timeout=1)
        except sx.WorkerUnavailableError:
            break
        time.sleep(0.1)
    start = time.monotonic()
    coordinator.schedule(step_fn, args=(iterator,))
    try:
        coordinator.join()
        result["error"] = None
    except Exception as err:
        result["error"] = str(err)
    result["error_s"] = time.monotonic() - start
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
