"""Checkpoints that change shape; argv: scenario, directory.

- ``first`` (chief + 1 worker + 2 ps, FixedShardsPartitioner(2)): trains CALLS calls, saves
  ``ckpt1.npz``, trains CALLS more; reports the final weights.
- ``mirrored`` (one process, MirroredStrategy): loads ``ckpt1.npz`` into the Keras model and
  its Adam, saves ``ckpt2.npz`` with the weights doubled, then trains on the batches ``first``
  trained on after its checkpoint (Keras' own Adam).
- ``second`` (chief + 1 worker + 1 ps, FixedShardsPartitioner(3)): restores ``ckpt2.npz``
  (values from Keras), then ``ckpt1.npz`` (values and Adam state, resharded 2 -> 3 shards),
  trains CALLS calls; each ``train`` builds a new per-worker iterator, so these read the
  batches ``first``'s second half read.
One worker, so the steps run in order and both runs are deterministic.
"""

import json
import sys
from pathlib import Path

import numpy as np

import stratax as sx

BATCH, CALLS, STEPS = 16, 4, 2


def dataset_fn(ctx):
    rng = np.random.default_rng(3)
    true_w = np.linspace(-1, 1, 8, dtype=np.float32)[:, None]
    while True:
        x = rng.normal(size=(BATCH, 8)).astype(np.float32)
        yield x, x @ true_w + 0.3


def build_model():
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(6), keras.layers.Dense(1)])


def weights(values):
    return [np.asarray(v).tolist() for v in values]


def train(strategy, coordinator, model, optimizer, calls):
    import jax
    import jax.numpy as jnp

    def replica_fn(x, y):
        def loss_fn(trainable):
            pred, _ = model.stateless_call(trainable, [], x)
            return jnp.mean((pred - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(strategy.read(model.trainable_variables))
        strategy.apply_gradients(zip(grads, model.trainable_variables, strict=True), optimizer)
        return loss

    def step_fn(iterator):
        return [strategy.run(replica_fn, args=next(iterator)) for _ in range(STEPS)]

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    for _ in range(calls):
        coordinator.schedule(step_fn, args=(iterator,))
    coordinator.join()


def main():
    scenario, directory = sys.argv[1], Path(sys.argv[2])
    if scenario == "mirrored":
        import keras

        strategy = sx.MirroredStrategy()
        with strategy.scope():
            model = build_model()
            optimizer = keras.optimizers.Adam(0.05)
            model.compile(optimizer=optimizer, loss="mse")
        variables = model.trainable_variables
        loaded = sx.checkpoint.load_variables(directory / "ckpt1.npz", variables, optimizer)
        before = [v.numpy() for v in variables]
        iterations = int(optimizer.iterations.numpy())
        for v, value in zip(variables, before, strict=True):
            v.assign(value * 2)
        sx.checkpoint.save_variables(directory / "ckpt2.npz", variables, optimizer)
        for v, value in zip(variables, before, strict=True):
            v.assign(value)
        batches = dataset_fn(None)        # the batches `first` trained on after its checkpoint
        for _ in range(CALLS * STEPS):
            model.train_on_batch(*next(batches))
        print("RESULT " + json.dumps({"loaded": loaded, "weights": weights(before),
                                      "iterations": iterations,
                                      "trained": weights(v.numpy() for v in variables)}),
              flush=True)
        return
    import keras

    first = scenario == "first"
    strategy = sx.ParameterServerStrategy(
        variable_partitioner=sx.partitioners.FixedShardsPartitioner(2 if first else 3),
        timeout_seconds=30)
    coordinator = sx.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.Adam(0.05)   # one optimizer: its config names it
    variables = model.trainable_variables
    result = {}
    if first:
        train(strategy, coordinator, model, optimizer, CALLS)
        strategy.save_checkpoint(str(directory / "ckpt1.npz"))
        result["saved"] = weights(v.numpy() for v in strategy.variables)
    else:
        strategy.restore_checkpoint(str(directory / "ckpt2.npz"), variables)
        result["from_mirrored"] = weights(v.numpy() for v in strategy.variables)
        strategy.restore_checkpoint(str(directory / "ckpt1.npz"), variables)
    train(strategy, coordinator, model, optimizer, CALLS)
    result["final"] = weights(v.numpy() for v in strategy.variables)
    result["shards"] = [len(v.placements) for v in strategy.variables]
    result["ps"] = sorted({p.ps for v in strategy.variables for p in v.placements})
    result["iterations"] = [strategy.optimizer_iterations(v) for v in strategy.variables]
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
