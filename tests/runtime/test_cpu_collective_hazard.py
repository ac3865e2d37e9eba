"""Regression test for XLA's in-process CPU all-reduce deadlock (FINDINGS.md).

Unbounded asynchronous dispatch of a wide-model step over 2 CPU devices aborts with "Termination
timeout for all reduce"; stratax bounds the steps in flight. The workload runs in a subprocess
because the failure mode is an abort of the whole process.
"""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import stratax as sx
    sx.set_cpu_device_count(2)
    import jax, jax.numpy as jnp, keras, numpy as np

    strategy = sx.MirroredStrategy()
    rng = np.random.default_rng(0)
    sizes = [(784, 1024), (1024, 1024), (1024, 10)]
    params = [jnp.asarray(rng.normal(0, 0.01, s), jnp.float32) for s in sizes]
    x = rng.random((256, 784), dtype=np.float32)
    y = rng.integers(0, 10, 256)
    batch = next(iter(strategy.experimental_distribute_dataset([(x, y)])))

    def loss_fn(p, x, y):
        h = jax.nn.relu(x @ p[0]); h = jax.nn.relu(h @ p[1])
        logp = jax.nn.log_softmax(h @ p[2])
        return sx.compute_average_loss(-jnp.take_along_axis(logp, y[:, None], 1)[:, 0],
                                       global_batch_size=256)

    def step(p, batch):
        grads = jax.grad(loss_fn)(p, *batch)
        grads = sx.get_replica_context().all_reduce("sum", grads)
        return [w - 0.01 * g for w, g in zip(p, grads)]

    for _ in range(200):            # custom loop: host never waits explicitly
        params = strategy.run(step, args=(params, batch))
    jax.block_until_ready(params)

    with strategy.scope():         # Keras fit with steps_per_execution=32
        model = keras.Sequential([keras.Input((784,)),
                                  keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(1024, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam", steps_per_execution=32,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    xs = np.tile(x, (40, 1)); ys = np.tile(y, 40)
    model.fit(xs, ys, epochs=2, batch_size=256, verbose=0)
    print("completed", strategy.dispatch_window.size)
""")


@pytest.mark.timeout(300)
def test_wide_model_on_two_cpu_devices_does_not_deadlock():
    env = {k: v for k, v in os.environ.items()
           if k not in ("STRATAX_CPU_DEVICES", "STRATAX_MAX_STEPS_IN_FLIGHT")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=280, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == ["completed", "2"]
