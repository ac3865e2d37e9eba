"""TensorFlow's "Custom training with tf.distribute.Strategy" tutorial, the JAX way.

The program of https://www.tensorflow.org/tutorials/distribute/custom_training on stratax. The
strategy part reads as in TensorFlow: ``strategy.run(train_step, ...)``,
``sx.compute_average_loss``, an all-reduce of the gradients, ``strategy.reduce(SUM, ...)``.
What changes is JAX's functional style: instead of ``GradientTape`` and variables updated in
place, the step takes the model, optimizer and metric state as arrays and returns the new state
(Keras' stateless API: ``model.stateless_call``, ``optimizer.stateless_apply``,
``metric.stateless_update_state``). At the end the state is written back into the Keras
model, which is saved, restored without a strategy (the tutorial's checkpoint section) and
evaluated. Data: the 8x8 digits embedded in stratax instead of a Fashion-MNIST download, fed
by the tutorial's ``tf.data`` pipelines through ``strategy.experimental_distribute_dataset``.

Run it::

    python examples/custom_training_loop.py                        # all local devices
    STRATAX_CPU_DEVICES=2 python examples/custom_training_loop.py  # 2 CPU replicas
    python examples/custom_training_loop.py --epochs 2             # a quick run
"""

import argparse
import os
import tempfile

import stratax as sx  # import stratax before keras: it selects Keras' JAX backend

import jax  # isort: skip
import keras  # isort: skip
import numpy as np  # isort: skip
import tensorflow as tf  # isort: skip  (the tutorial's input pipeline)

from stratax.datasets import load_digits

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=10, help="training epochs (default: 10)")
parser.add_argument("--workdir", default=None,
                    help="where the checkpoint goes (default: a temp folder)")
parser.add_argument("--seed", type=int, default=None,
                    help="seed the initial weights and shuffling (default: unseeded, as in "
                         "the guide)")
flags = parser.parse_args()

strategy = sx.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}")
if flags.seed is not None:
    keras.utils.set_random_seed(flags.seed)

# ---------------------------------------------------------------------------- input
(train_images, train_labels), (test_images, test_labels) = load_digits(flatten=False)

BATCH_SIZE_PER_REPLICA = 64
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = flags.epochs


BUFFER_SIZE = len(train_images)


def examples(images, labels):
    """(image, label, weight 1) examples. The last, partial global batch is padded over the
    replicas with zero rows, whose weight 0 keeps them out of the loss and the metrics."""
    return tf.data.Dataset.from_tensor_slices(
        (images, labels, np.ones(len(images), np.float32)))


train_dataset = examples(train_images, train_labels).shuffle(
    BUFFER_SIZE, seed=flags.seed).batch(GLOBAL_BATCH_SIZE)
test_dataset = examples(test_images, test_labels).batch(GLOBAL_BATCH_SIZE)

train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)


# ---------------------------------------------------------------------------- model
def create_model():
    regularizer = keras.regularizers.L2(1e-5)
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu", padding="same",
                            kernel_regularizer=regularizer),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu", padding="same",
                            kernel_regularizer=regularizer),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu", kernel_regularizer=regularizer),
        keras.layers.Dense(10, kernel_regularizer=regularizer),
    ])


with strategy.scope():
    model = create_model()
    optimizer = keras.optimizers.Adam(learning_rate=0.001)
    optimizer.build(model.trainable_variables)
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    test_loss = keras.metrics.Mean(name="test_loss")

loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def compute_loss(labels, logits, weights, model_losses):
    per_example_loss = loss_object(labels, logits)
    loss = sx.compute_average_loss(per_example_loss, sample_weight=weights,
                                   global_batch_size=GLOBAL_BATCH_SIZE)
    if model_losses:
        loss += sx.scale_regularization_loss(sum(model_losses))
    return loss


def values(variables):
    return [v.value for v in variables]


# ---------------------------------------------------------------------------- steps
def train_step(state, inputs):
    images, labels, weights = inputs

    def loss_fn(trainable):
        logits, non_trainable, losses = model.stateless_call(
            trainable, state["non_trainable"], images, training=True, return_losses=True)
        return compute_loss(labels, logits, weights, losses), (logits, non_trainable)

    (loss, (logits, non_trainable)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state["trainable"])
    replica = sx.get_replica_context()
    grads = replica.all_reduce(sx.ReduceOp.SUM, grads)
    trainable, optimizer_vars = optimizer.stateless_apply(state["optimizer"], grads,
                                                          state["trainable"])
    # The metric sees the whole global batch, as TensorFlow's metrics do under a strategy.
    labels, logits, weights = replica.all_gather((labels, logits, weights), axis=0)
    accuracy_vars = train_accuracy.stateless_update_state(state["train_accuracy"], labels,
                                                          logits, sample_weight=weights)
    return loss, {"trainable": trainable, "non_trainable": non_trainable,
                  "optimizer": optimizer_vars, "train_accuracy": accuracy_vars}


def test_step(state, metrics, inputs):
    images, labels, weights = inputs
    logits, _ = model.stateless_call(state["trainable"], state["non_trainable"], images,
                                     training=False)
    per_example_loss = loss_object(labels, logits)
    labels, logits, weights, per_example_loss = sx.get_replica_context().all_gather(
        (labels, logits, weights, per_example_loss), axis=0)
    return {
        "test_loss": test_loss.stateless_update_state(metrics["test_loss"], per_example_loss,
                                                      sample_weight=weights),
        "test_accuracy": test_accuracy.stateless_update_state(metrics["test_accuracy"], labels,
                                                              logits, sample_weight=weights),
    }


# ---------------------------------------------------------------------------- training loop
state = {
    "trainable": values(model.trainable_variables),
    "non_trainable": values(model.non_trainable_variables),
    "optimizer": values(optimizer.variables),
    "train_accuracy": values(train_accuracy.variables),
}

for epoch in range(EPOCHS):
    # Train loop.
    total_loss = 0.0
    num_batches = 0
    for batch in train_dist_dataset:  # each pass reshuffles, as in TensorFlow
        per_replica_losses, state = strategy.run(train_step, args=(state, batch))
        total_loss += strategy.reduce(sx.ReduceOp.SUM, per_replica_losses, axis=None)
        num_batches += 1
    train_loss = total_loss / num_batches

    # Test loop.
    metrics = {"test_loss": values(test_loss.variables),
               "test_accuracy": values(test_accuracy.variables)}
    for batch in test_dist_dataset:
        metrics = strategy.run(test_step, args=(state, metrics, batch))

    train_acc = train_accuracy.stateless_result(state["train_accuracy"])
    test_acc = test_accuracy.stateless_result(metrics["test_accuracy"])
    print(f"Epoch {epoch + 1}, Loss: {float(train_loss):.4f}, "
          f"Accuracy: {float(train_acc) * 100:.2f}, "
          f"Test Loss: {float(test_loss.stateless_result(metrics['test_loss'])):.4f}, "
          f"Test Accuracy: {float(test_acc) * 100:.2f}")

    # Reset the train metric: its Keras variables were never touched, so they hold zeros.
    state["train_accuracy"] = values(train_accuracy.variables)

# ---------------------------------------------------------------------------- back to Keras
for variable, value in zip(model.trainable_variables, state["trainable"], strict=True):
    variable.assign(value)
for variable, value in zip(model.non_trainable_variables, state["non_trainable"], strict=True):
    variable.assign(value)
for variable, value in zip(optimizer.variables, state["optimizer"], strict=True):
    variable.assign(value)

with strategy.scope():
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
eval_loss, eval_acc = model.evaluate(test_images, test_labels, batch_size=GLOBAL_BATCH_SIZE,
                                     verbose=0)
print(f"Keras evaluate under the strategy: loss {eval_loss:.4f}, accuracy {eval_acc * 100:.2f}")

# Restore the trained weights into a new model with no strategy (the tutorial's checkpoint part).
workdir = flags.workdir or tempfile.mkdtemp(prefix="stratax_custom_loop_")
checkpoint = os.path.join(workdir, "ckpt.weights.h5")
model.save_weights(checkpoint)
new_model = create_model()
new_model.load_weights(checkpoint)
new_model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
_, restored_acc = new_model.evaluate(test_images, test_labels, batch_size=GLOBAL_BATCH_SIZE,
                                     verbose=0)
print(f"Accuracy after restoring the saved model without strategy: {restored_acc * 100:.2f}")
