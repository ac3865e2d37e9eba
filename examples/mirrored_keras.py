"""TensorFlow's "Distributed training with Keras" guide, ported to stratax.

The program of https://www.tensorflow.org/tutorials/distribute/keras with two import lines
changed (``import tensorflow as tf`` -> ``import stratax as sx`` + ``import keras``) and three
local changes, each marked ``# stratax:`` below:

- the data are the 8x8 handwritten digits embedded in stratax instead of a MNIST download
  (and numpy arrays with a global ``batch_size`` instead of a ``tf.data`` pipeline);
- Keras 3 spells checkpoints ``*.weights.h5`` and whole models ``*.keras`` (no SavedModel);
- the learning-rate schedule is raised and stretched for the smaller data set (12-23 steps per
  epoch instead of 938); the guide's values leave the model near 92% test accuracy here.

Run it::

    python examples/mirrored_keras.py                        # all local devices (1 CPU here)
    STRATAX_CPU_DEVICES=2 python examples/mirrored_keras.py  # split the CPU into 2 replicas
    python examples/mirrored_keras.py --epochs 2             # a quick run
"""

import argparse
import os
import tempfile

import stratax as sx  # stratax: was `import tensorflow as tf`; import it before keras

import keras  # isort: skip

from stratax.datasets import load_digits  # stratax: was tensorflow_datasets' MNIST

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=12, help="training epochs (default: 12)")
parser.add_argument("--workdir", default=None,
                    help="where checkpoints and the saved model go (default: a temp folder)")
parser.add_argument("--seed", type=int, default=None,
                    help="seed the initial weights and shuffling (default: unseeded, as in "
                         "the guide)")
flags = parser.parse_args()

# Define the distribution strategy.
strategy = sx.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")
if flags.seed is not None:
    keras.utils.set_random_seed(flags.seed)

# Set up the input: the batch size is global, so scale it with the number of replicas.
BATCH_SIZE_PER_REPLICA = 64
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
(train_images, train_labels), (eval_images, eval_labels) = load_digits(flatten=False)
print(f"{len(train_images)} training and {len(eval_images)} evaluation images of shape "
      f"{train_images.shape[1:]}, already scaled to [0, 1]")

# Create the model and compile it within the strategy's scope: its variables are mirrored.
with strategy.scope():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),  # stratax: the guide had 28x28x1 MNIST images
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.Adam(),
                  metrics=["accuracy"])

# Define the callbacks: checkpoints, learning-rate decay, and a print of the learning rate.
workdir = flags.workdir or tempfile.mkdtemp(prefix="stratax_mirrored_keras_")
checkpoint_dir = os.path.join(workdir, "training_checkpoints")
os.makedirs(checkpoint_dir, exist_ok=True)
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch}.weights.h5")


def decay(epoch):
    # stratax: the guide uses 1e-3, 1e-4, 1e-5 from epochs 0, 3, 7 (of 938 MNIST steps each).
    if epoch < 8:
        return 1e-2
    elif epoch < 11:
        return 1e-3
    else:
        return 1e-4


class PrintLR(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print(f"\nLearning rate for epoch {epoch + 1} is "
              f"{float(model.optimizer.learning_rate.numpy())}")


callbacks = [
    keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    keras.callbacks.LearningRateScheduler(decay),
    PrintLR(),
]

# Train: `model.fit` runs every step on all replicas, with gradients all-reduced.
EPOCHS = flags.epochs
model.fit(train_images, train_labels, batch_size=BATCH_SIZE, epochs=EPOCHS, callbacks=callbacks,
          verbose=2)

# Restore the latest checkpoint and evaluate.
model.load_weights(checkpoint_prefix.format(epoch=EPOCHS))
eval_loss, eval_acc = model.evaluate(eval_images, eval_labels, batch_size=BATCH_SIZE, verbose=2)
print(f"Eval loss: {eval_loss}, Eval accuracy: {eval_acc}")

# Save the model, then load it without a strategy and under the strategy again.
path = os.path.join(workdir, "digits.keras")  # stratax: Keras 3 saves `.keras` files
model.save(path)

unreplicated_model = keras.models.load_model(path)
unreplicated_model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           optimizer=keras.optimizers.Adam(),
                           metrics=["accuracy"])
eval_loss, eval_acc = unreplicated_model.evaluate(eval_images, eval_labels, batch_size=BATCH_SIZE,
                                                  verbose=0)
print(f"Unreplicated model: Eval loss: {eval_loss}, Eval Accuracy: {eval_acc}")

with strategy.scope():
    replicated_model = keras.models.load_model(path)
    replicated_model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                             optimizer=keras.optimizers.Adam(),
                             metrics=["accuracy"])
    eval_loss, eval_acc = replicated_model.evaluate(eval_images, eval_labels,
                                                    batch_size=BATCH_SIZE, verbose=0)
    print(f"Replicated model: Eval loss: {eval_loss}, Eval Accuracy: {eval_acc}")
