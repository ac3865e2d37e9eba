"""The smallest ParameterServerStrategy program: one variable, three SGD steps."""

import json

import numpy as np

import stratax as sx


def dataset_fn(ctx):
    while True:
        yield (np.ones((4, 2), np.float32),)


strategy = sx.ParameterServerStrategy(timeout_seconds=30)
coordinator = sx.coordinator.ClusterCoordinator(strategy)
w = strategy.create_variable(np.zeros(2, np.float32), name="w")


def replica_fn(x):
    strategy.apply_gradients([(x.sum(axis=0), w)], {"class_name": "SGD",
                                                    "config": {"learning_rate": 0.5}})
    return strategy.read(w).sum()


iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
for _ in range(3):
    coordinator.schedule(lambda it: strategy.run(replica_fn, args=next(it)), args=(iterator,))
coordinator.join()
print("RESULT " + json.dumps({"w": w.numpy().tolist()}), flush=True)
