"""TensorFlow's "Multi-worker training with Keras" guide, ported to stratax.

The program of https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras (its
``main.py`` with ``mnist_setup.py`` inlined) with the imports changed (``import stratax as sx``
and ``import keras`` added; ``tf.distribute.X`` -> ``sx.X``, ``tf.keras.X`` -> ``keras.X``), the
embedded 8x8 digits instead of a MNIST download, and Keras 3 file names (``.keras``). The input
is the guide's own ``tf.data`` pipeline (``shuffle().repeat().batch(global_batch_size)`` and
``steps_per_epoch=70``): every worker builds it, and stratax shares each global batch between
the workers as TensorFlow's ``AUTO`` policy does for in-memory data (by rows). Every worker runs
this same program; ``TF_CONFIG`` tells each one its place in the cluster.

Run two workers on this machine with the stratax launcher (it writes each worker's
``TF_CONFIG``)::

    stratax launch --nproc-per-node 2 examples/multi_worker_keras.py

or by hand, one shell per worker, as in the guide::

    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:23456"]},
                "task": {"type": "worker", "index": 0}}' python examples/multi_worker_keras.py
    TF_CONFIG='{"cluster": {"worker": ["localhost:12345", "localhost:23456"]},
                "task": {"type": "worker", "index": 1}}' python examples/multi_worker_keras.py

Without ``TF_CONFIG`` it trains as a single worker.
"""

import argparse
import json
import os
import tempfile

os.environ["CUDA_VISIBLE_DEVICES"] = "-1"  # as in the guide: the workers share one machine's CPU

import stratax as sx  # added; import it before tensorflow and keras

import keras  # isort: skip  (added: tf.keras -> keras)
import numpy as np  # isort: skip
import tensorflow as tf  # isort: skip  (the guide's input pipeline)

from stratax.datasets import load_digits  # was keras' MNIST download

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=3, help="training epochs (default: 3)")
parser.add_argument("--steps-per-epoch", type=int, default=70,
                    help="steps per epoch (default: 70, as the guide)")
parser.add_argument("--seed", type=int, default=None,
                    help="seed of the model's initial weights (added: reproducible runs)")
parser.add_argument("--workdir", default=None,
                    help="where the backup and the saved model go; use a folder all workers "
                         "share (default: one temp folder per run of the chief)")
flags = parser.parse_args()


# ---------------------------------------------------------------- mnist_setup.py, on the digits
def mnist_dataset(batch_size):
    (x_train, y_train), _ = load_digits(flatten=False)  # already float32 in [0, 1]
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(60000, seed=0).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    model = keras.Sequential([
        keras.layers.InputLayer(shape=(8, 8, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.SGD(learning_rate=0.01),
        metrics=["accuracy"])
    return model


# ---------------------------------------------------------------- main.py
per_worker_batch_size = 64
tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1

strategy = sx.MultiWorkerMirroredStrategy()
print(f"Number of replicas in sync: {strategy.num_replicas_in_sync}")

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

if flags.seed is not None:
    keras.utils.set_random_seed(flags.seed)
with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

workdir = flags.workdir or os.path.join(tempfile.gettempdir(), "stratax_multi_worker_keras")
# Fault tolerance: if a worker dies, restart the whole group and training resumes from the
# last backup here (`stratax launch --max-restarts 1` restarts it for you). The guide's
# `tf.keras.callbacks.BackupAndRestore` is `sx.BackupAndRestore`: it knows the strategy's
# workers, lets only the chief write, and can also back up every N steps (`save_freq=N`).
callbacks = [sx.BackupAndRestore(backup_dir=os.path.join(workdir, "backup"))]
multi_worker_model.fit(multi_worker_dataset, epochs=flags.epochs,
                       steps_per_epoch=flags.steps_per_epoch, callbacks=callbacks)


# ---------------------------------------------------------------- saving: only the chief keeps it
def _is_chief(task_type, task_id):
    # Note: there are two possible `TF_CONFIG` configurations.
    #   1) In addition to `worker` tasks, a `chief` task type is used;
    #      in this case, this function should be modified to
    #      `return task_type == 'chief'`.
    #   2) Only `worker` task type is used; in this case, worker 0 is
    #      regarded as the chief. The implementation demonstrated here
    #      is for this case.
    # For the purpose of this example, the case where `task_type` is `None`
    # (a single worker without TF_CONFIG) is also handled: it is the chief.
    return task_type is None or (task_type == "worker" and task_id == 0)


def _get_temp_dir(dirpath, task_id):
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    os.makedirs(temp_dir, exist_ok=True)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    os.makedirs(dirpath, exist_ok=True)
    return os.path.join(dirpath, base)


model_path = os.path.join(workdir, "keras-model.keras")
task_type, task_id = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
write_model_path = write_filepath(model_path, task_type, task_id)
multi_worker_model.save(write_model_path)
if not _is_chief(task_type, task_id):
    os.remove(write_model_path)
    os.rmdir(os.path.dirname(write_model_path))
else:
    loaded_model = keras.models.load_model(model_path)
    loaded_model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                         metrics=["accuracy"])
    _, (x_test, y_test) = load_digits(flatten=False)
    _, accuracy = loaded_model.evaluate(x_test, y_test, verbose=0)
    print(f"Chief saved the model to {model_path}; its test accuracy: {accuracy:.4f}")
