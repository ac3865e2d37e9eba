"""ResNet50 on CIFAR-10-shaped data under MirroredStrategy (synthetic images: no download).

``keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)`` trained with
``model.fit`` on every local device: the workload of TensorFlow's multi-GPU Keras benchmarks,
with random images and labels so it runs anywhere. It prints the training throughput measured
after the first epoch (which includes XLA compilation).

Run it::

    python examples/cifar_resnet.py                         # all local GPUs (or 1 CPU device)
    STRATAX_CPU_DEVICES=2 python examples/cifar_resnet.py --steps 5 --batch-size-per-replica 8
    python examples/cifar_resnet.py --quick                 # smoke test: 1 step, 2 images/replica

On a 2-core CPU, building the model takes ~10 s, compiling the training step ~20 s and one step
at a global batch of 8 ~0.9 s (2 CPU replicas); use a GPU for real runs.
"""

import argparse
import time

import stratax as sx  # import stratax before keras: it selects Keras' JAX backend

import keras  # isort: skip
import numpy as np  # isort: skip

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=3, help="epochs (default: 3)")
parser.add_argument("--steps", type=int, default=50, help="steps per epoch (default: 50)")
parser.add_argument("--batch-size-per-replica", type=int, default=64,
                    help="images per replica per step (default: 64)")
parser.add_argument("--quick", action="store_true",
                    help="smoke test: 1 epoch of 1 step with 2 images per replica")
parser.add_argument("--seed", type=int, default=None,
                    help="seed the initial weights and shuffling (default: unseeded, as in "
                         "the guide)")
flags = parser.parse_args()
if flags.quick:
    flags.epochs, flags.steps, flags.batch_size_per_replica = 1, 1, 2

strategy = sx.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")
if flags.seed is not None:
    keras.utils.set_random_seed(flags.seed)
GLOBAL_BATCH_SIZE = flags.batch_size_per_replica * strategy.num_replicas_in_sync

# Synthetic CIFAR-10: uint8-range images scaled to [0, 1], labels 0..9.
rng = np.random.default_rng(0)
num_images = flags.steps * GLOBAL_BATCH_SIZE
x_train = (rng.integers(0, 256, (num_images, 32, 32, 3)) / 255.0).astype(np.float32)
y_train = rng.integers(0, 10, num_images)

start = time.perf_counter()
with strategy.scope():
    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=["accuracy"])
print(f"Built ResNet50 ({model.count_params():,} parameters) in "
      f"{time.perf_counter() - start:.1f} s")


class Throughput(keras.callbacks.Callback):
    """Images per second of each epoch after the first (the first one compiles)."""

    def __init__(self):
        super().__init__()
        self.durations = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.durations.append(time.perf_counter() - self._start)


timer = Throughput()
history = model.fit(x_train, y_train, batch_size=GLOBAL_BATCH_SIZE, epochs=flags.epochs,
                    callbacks=[timer], verbose=2)
first, rest = timer.durations[0], timer.durations[1:]
print(f"First epoch (with compilation): {first:.1f} s")
if rest:
    print(f"Throughput: {num_images * len(rest) / sum(rest):,.1f} images/s over epochs "
          f"2-{flags.epochs}, global batch {GLOBAL_BATCH_SIZE}, "
          f"{strategy.num_replicas_in_sync} replicas")
print(f"Final loss: {history.history['loss'][-1]:.4f}")
