"""Chief of the lifecycle tests: chief + workers + 1 ps, asynchronous SGD on a linear model.

argv: ``seconds`` to train after STARTED (in rounds of ROUND calls of STEPS steps, each round
joined), ``timeout_seconds`` of the strategy, and optionally ``pause`` seconds to sleep after
STARTED before training (the cluster idle). Prints STARTED once the step is compiled, then a
RESULT line: steps scheduled, the ps' ``iterations``, applied step ids and duplicates, the
longest round (a stall shows there), and the error of a round that raised with the wall-clock
time it was raised (then nothing else: a lost ps has nothing to report).
"""

import json
import sys
import time

import linear

import stratax as sx

STEPS, ROUND = 2, 10


def main():
    seconds, timeout = float(sys.argv[1]), float(sys.argv[2])
    strategy = sx.ParameterServerStrategy(timeout_seconds=timeout)
    coordinator = sx.coordinator.ClusterCoordinator(strategy, progress_seconds=0)
    w, step_fn, iterator = linear.start(strategy, coordinator, {
        "class_name": "SGD", "config": {"learning_rate": 0.01}}, STEPS)
    time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0.0)
    calls, longest = 1, 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            for _ in range(ROUND):
                coordinator.schedule(step_fn, args=(iterator,))
                calls += 1
            coordinator.join()
        except sx.StrataxError as err:
            error = str(err)
            print("RESULT " + json.dumps({"error": error, "error_at": time.time()}), flush=True)
            return
        longest = max(longest, time.monotonic() - start)
    stats = strategy.shard_stats(w)[0]
    print("RESULT " + json.dumps({
        "scheduled": calls * STEPS, "iterations": stats["iterations"],
        "applied": stats["applied_steps"], "duplicates": stats["duplicates"],
        "ledger": len(set(strategy.applied_steps(w)[0])), "longest_round_s": longest,
        "stats": coordinator.stats()}), flush=True)


if __name__ == "__main__":
    main()
